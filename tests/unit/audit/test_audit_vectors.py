"""The committed vectors are exactly what tests/vectors/make_audit_vectors.py writes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

VECTORS = Path(__file__).resolve().parents[2] / "vectors"


def test_vectors_are_current(vector_maker: ModuleType, tmp_path: Path) -> None:
    """Regenerating the vectors gives byte-identical files (deterministic key, times and nonce)."""
    generated = vector_maker.vectors(tmp_path)
    assert generated, "the generator wrote nothing"
    for name, data in generated.items():
        assert (VECTORS / name).read_bytes() == data, f"{name} is stale: run make_audit_vectors.py"
