"""PostgreSQL schema version 10: a task row names the upstream tool of the call that created it (issue 24).

Its ``tasks/*`` requests are then refused as an unknown task once no grant of the caller covers
that tool any more, not only once none names its server. Rows written before this version have
none (``NULL``) and are checked per server, as they were.
"""

from __future__ import annotations

STATEMENTS: tuple[str, ...] = ("ALTER TABLE tasks ADD COLUMN tool TEXT",)
