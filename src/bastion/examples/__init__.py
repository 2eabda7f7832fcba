"""Example upstream MCP servers that ship with Bastion, for tests, demos and ``bench/``.

- ``python -m bastion.examples.notes_server``: stdio, both protocol eras.
- ``python -m bastion.examples.tools_server --host H --port N [--json-response]``:
  Streamable HTTP, both protocol eras; prints ``LISTENING <url>`` when ready.

They are fixtures, not part of the gateway: nothing else in ``bastion`` imports them.
"""
