"""Every child process Bastion starts ends when Bastion ends, whatever ended it (issue #11 point 16).

A clean stop terminates the children in order (``upstream/stdio.py``,
``cli/serve.py``). A Bastion that is killed (SIGKILL, OOM) cannot; so on Linux
each child is started through a tiny launcher that asks the kernel for a
parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, which survives
``exec``), checks that its parent is still the one that launched it (the
parent may have died before the request), and then ``exec``\\ s the real
command: same PID, same arguments, same environment. Elsewhere the command
runs as given, and stdio servers still see their standard input close.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["guarded_command"]

# Runs in the child, before exec: no Bastion import, nothing but the standard library.
_GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)  # the launcher's parent is already gone\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def guarded_command(argv: Sequence[str]) -> list[str]:
    """``argv`` launched so that the process receives SIGTERM when this process dies (Linux)."""
    if not sys.platform.startswith("linux") or not argv:
        return list(argv)
    return [sys.executable, "-I", "-c", _GUARD, str(os.getpid()), *argv]
