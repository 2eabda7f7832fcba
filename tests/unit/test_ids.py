"""Gateway-minted ids (``ids.py``): fresh, well-formed, never handed out twice."""

from __future__ import annotations

import os
import re
import threading

import pytest

from bastion import ids
from bastion.ids import new_call_id

_CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def test_call_ids_are_distinct_across_threads_and_blocks() -> None:
    """Eight threads drawing ids through many 4 KiB blocks never see the same bytes twice."""
    drawn: list[list[str]] = [[] for _ in range(8)]

    def draw(into: list[str]) -> None:
        into.extend(new_call_id() for _ in range(2000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    every = [call_id for into in drawn for call_id in into]
    assert len(every) == 16_000
    assert len(set(every)) == len(every)
    assert all(_CALL_ID.fullmatch(call_id) for call_id in every)


def test_blocks_are_read_from_urandom_not_per_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """One read of the CSPRNG serves many ids; a request larger than a block still gets fresh bytes."""
    reads: list[int] = []
    real = os.urandom

    def counting(n: int) -> bytes:
        reads.append(n)
        return real(n)

    monkeypatch.setattr(ids.os, "urandom", counting)
    source = ids._UrandomBlocks(block=120)
    taken = [source.take(12) for _ in range(30)]
    assert reads == [120, 120, 120]
    assert len(set(taken)) == 30
    assert len(source.take(500)) == 500
    assert reads[-1] == 500


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_the_parents_bytes() -> None:
    """After fork, the child reads a fresh block: its next id is not the parent's next id."""
    new_call_id()  # the parent holds a partly used block
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        os.write(write_end, new_call_id().encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        child_id = pipe.read().decode()
    os.waitpid(pid, 0)
    assert _CALL_ID.fullmatch(child_id)
    assert child_id != new_call_id()
