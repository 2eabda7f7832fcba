"""One JSON object per log line (``logs.py``): the fields chosen, written as ``json.dumps`` writes them."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from bastion.logs import JsonFormatter


def test_a_line_holds_the_message_and_the_extra_fields_only_as_json_dumps_writes_them() -> None:
    """Non-ASCII kept, a non-plain value as its ``str()``, uvicorn's ANSI ``color_message`` and
    private attributes left out, the time in milliseconds (UTC)."""
    record = logging.LogRecord("bastion.access", logging.INFO, __file__, 1, "tools/call %s", ("wörk",), None)
    extra = {"agent": "ålice", "seq": 3, "duration_ms": 1.5, "reason": None, "ok": True, "kind": ValueError}
    for key, value in {**extra, "color_message": "\x1b[32mtools/call\x1b[0m", "_private": "x"}.items():
        setattr(record, key, value)
    line = JsonFormatter().format(record)
    ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
    expected = {"ts": ts, "level": "info", "logger": "bastion.access", "msg": "tools/call wörk"}
    expected |= {**extra, "kind": str(ValueError)}
    assert line == json.dumps(expected, ensure_ascii=False)
    assert "\x1b" not in line and "_private" not in line
