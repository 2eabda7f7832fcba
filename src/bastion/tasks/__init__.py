"""Tasks through the gateway (issue 24).

``relay.py``: the 2025-11-25 tasks of a session-era client, relayed to an upstream that declares
task-augmented tool calls, and the 2026 tasks extension's, for a request that negotiated it with
a server that declares it; each task owned in the store (agent and agent session) under a gateway
id, its ``tasks/*`` requests routed to its upstream, its execution settled when it ends.
``support.py``: what happens without that: a task augmentation the relay does not take is ignored,
a tool that runs only as a task is refused by name (``TaskRequired``), and a task nobody asked for
is not relayed.
"""
