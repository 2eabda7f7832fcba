"""Structured logs: one JSON object per line on stderr.

Never log a credential: the formatter emits only the message, the level, the
logger and the ``extra`` fields the code chose to attach.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

__all__ = ["configure_logging"]

# uvicorn's ``color_message`` (the message again, with ANSI colour codes) is for terminals only.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}
# Values written as they are (anything else as its str()); a tuple: isinstance is quicker on one.
_PLAIN = (str, int, float, bool, type(None))
# json.dumps(entry, ensure_ascii=False) builds a new encoder per line; this one is stateless.
_ENCODER = json.JSONEncoder(ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, _PLAIN) else str(value)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
