"""One log line per change of a repeating store task's state, with the cause (issue #23 point 5).

A loop that reads or writes the store every second (a heartbeat, the change
feed, the peer scan) fails every second in an outage. :class:`FailureLog`
says so once when it starts failing, once more when the cause changes, and
once when it works again; every failure in between goes to debug (with the
traceback, when there is one).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bastion.errors import BastionError

__all__ = ["FailureLog", "cause_of"]


def cause_of(exc: BaseException) -> str:
    """One line about a failure: a Bastion error's message and named cause, else the exception's type."""
    if isinstance(exc, BastionError):
        return exc.message + (f": {exc.cause}" if exc.cause else "")
    return type(exc).__name__


@dataclass
class FailureLog:
    """The log of one repeating task: ``what`` names it ("heartbeat", "change feed read")."""

    logger: logging.Logger
    what: str
    failing: str | None = None

    def failed(self, exc: BaseException, *, note: str = "") -> None:
        cause = cause_of(exc)
        if cause != self.failing:
            self.logger.warning("%s failed: %s%s", self.what, cause, note)
        self.logger.debug("%s failed", self.what, exc_info=exc)
        self.failing = cause

    def worked(self) -> None:
        if self.failing is not None:
            self.logger.info("%s works again", self.what)
        self.failing = None
