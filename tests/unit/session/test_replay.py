"""Per-session SSE replay buffers: exact, bounded, and blind to other sessions (issue 8 point 7)."""

from __future__ import annotations

import pytest

from bastion.errors import LastEventIdUnknown
from bastion.session.replay import ReplayLimits, SessionStreams


def test_replay_after_an_id_is_exactly_the_later_events() -> None:
    """Resuming after event n of a stream yields n+1.. of that stream only."""
    streams = SessionStreams()
    response = streams.open_response_stream()
    for n in range(1, 5):
        response.publish(b"r%d" % n)
    streams.server.publish(b"s1")
    stream, after = streams.resume(response.event_id(2))
    assert stream is response
    assert stream.after(after) == [(3, b"r3"), (4, b"r4")]


def test_another_sessions_id_is_unknown_here() -> None:
    """An id minted by one session's stream names nothing in another session."""
    mine, theirs = SessionStreams(), SessionStreams()
    theirs_response = theirs.open_response_stream()
    theirs_response.publish(b"secret")
    for foreign in (theirs_response.event_id(1), theirs.server.event_id(0), "nonsense", "abc-x"):
        with pytest.raises(LastEventIdUnknown):
            mine.resume(foreign)


def test_bounds_drop_the_oldest_and_a_gap_is_refused() -> None:
    """Past the event or byte bound the oldest events go; resuming before them is refused, not skipped."""
    limits = ReplayLimits(events_per_stream=3, bytes_per_stream=1024, streams_per_session=2)
    streams = SessionStreams(limits)
    for n in range(1, 7):
        streams.server.publish(b"x%d" % n)
    with pytest.raises(LastEventIdUnknown):
        streams.resume(streams.server.event_id(2))
    stream, after = streams.resume(streams.server.event_id(3))
    assert [n for n, _ in stream.after(after)] == [4, 5, 6]
    big = streams.open_response_stream()
    big.publish(b"a" * 700)
    big.publish(b"b" * 700)  # 1400 bytes > 1024: the first goes
    with pytest.raises(LastEventIdUnknown):
        big.after(0)
    assert big.after(1) == [(2, b"b" * 700)]


def test_old_finished_response_streams_are_forgotten_live_ones_kept() -> None:
    """Past the per-session stream bound the oldest finished response streams go; answering ones stay."""
    streams = SessionStreams(ReplayLimits(streams_per_session=2))
    live = streams.open_response_stream()
    live.publish(b"live")
    done = []
    for _ in range(3):
        stream = streams.open_response_stream()
        stream.publish(b"x")
        stream.finish()
        done.append(stream)
    streams.open_response_stream()
    assert streams.resume(live.event_id(0))[0] is live
    with pytest.raises(LastEventIdUnknown):
        streams.resume(done[0].event_id(0))
