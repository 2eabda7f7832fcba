"""Put the repository root on ``sys.path``, so that ``python bench/X.py`` imports ``tests.support``.

The throwaway PostgreSQL cluster and the loopback server that bench uses are
test support, not part of the shipped ``bastion`` package. Import this module
(for its effect) before ``from tests.support... import ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[1])

if REPO not in sys.path:
    sys.path.insert(1, REPO)  # after bench/ itself (sys.path[0] for ``python bench/X.py``)
