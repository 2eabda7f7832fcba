"""Tasks through the gateway (issue 24): what the gateway does with MCP tasks today.

``support.py``: a task outlives the call that made it, and a governed task needs an owner, an
audit trail and an execution that spans it; until the gateway holds those, no task is created
through it. A task augmentation is ignored (the call runs to its result, as the 2025-11-25 spec
asks of a receiver that does not declare tasks), a tool that runs only as a task is refused by
name (``TaskRequired``), and neither the ``tasks`` capability nor the tasks extension is
announced (``surface/capabilities.py``).
"""
