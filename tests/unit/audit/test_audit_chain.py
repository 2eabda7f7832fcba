"""Building a chain in memory: genesis, attestation, entries, close."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from bastion.audit.chain import (
    ChainBuilder,
    ChainSummary,
    CloseReason,
    attestation_entry,
    make_genesis,
    next_entry,
)
from bastion.audit.entry import GENESIS_PREV, AuditEvent, compute_hash
from bastion.audit.tee import no_attestation

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY_ID = "k" * 43


def _open() -> ChainBuilder:
    return ChainBuilder.open(session_id="ev_1", agent="agent-a", key_id=KEY_ID, at=T0, nonce="n" * 43)


def test_genesis_commits_to_key_session_agent_and_nonce() -> None:
    """The genesis is seq 0 after 64 zeros; its hash covers the key id, session, agent and nonce."""
    genesis = _open().head
    assert (genesis.seq, genesis.prev, genesis.event) == (0, GENESIS_PREV, "session_open")
    assert genesis.detail == {"key_id": KEY_ID, "nonce": "n" * 43}
    assert (genesis.session_id, genesis.agent) == ("ev_1", "agent-a")
    assert genesis.hash == compute_hash(GENESIS_PREV, genesis.body())


def test_every_root_is_unique() -> None:
    """Two sessions opened alike get different roots, through the random nonce."""
    a = make_genesis(session_id="ev_1", agent="a", key_id=KEY_ID, at=T0)
    b = make_genesis(session_id="ev_1", agent="a", key_id=KEY_ID, at=T0)
    assert a.hash != b.hash
    assert len(a.detail["nonce"]) >= 43


def test_entries_link_by_seq_and_prev() -> None:
    """Each entry is the previous seq + 1 with prev = the previous hash, in the same session."""
    chain = _open()
    chain.bind_attestation(no_attestation("none here"), at=T0)
    chain.append(AuditEvent.COMPLETED, at=T0, call_id="c1", execution_id="e1")
    chain.close(CloseReason.SHUTDOWN, at=T0)
    entries = chain.entries
    assert [e.seq for e in entries] == [0, 1, 2, 3]
    for earlier, later in itertools.pairwise(entries):
        assert later.prev == earlier.hash
        assert later.session_id == "ev_1" and later.agent == "agent-a"
        assert later.hash == compute_hash(later.prev, later.body())
    assert entries[1].detail == {"attestation": {"kind": "none", "reason": "none here"}}
    assert entries[3].detail == {"close_reason": "shutdown"}


def test_summary_states_the_chain_and_no_execution_ids() -> None:
    """The summary holds root, head, count, times, key, attestation and close reason, nothing more."""
    chain = _open()
    chain.bind_attestation(no_attestation("x"), at=T0)
    chain.append(AuditEvent.COMPLETED, at=datetime(2026, 3, 1, 12, 1, tzinfo=UTC), execution_id="secret-exec")
    chain.close(CloseReason.REVOCATION, at=datetime(2026, 3, 1, 12, 2, tzinfo=UTC))
    summary = chain.summary()
    assert summary == ChainSummary(
        session_id="ev_1",
        agent="agent-a",
        key_id=KEY_ID,
        root=chain.root,
        head=chain.head.hash,
        entry_count=4,
        first_ts="2026-03-01T12:00:00.000000Z",
        last_ts="2026-03-01T12:02:00.000000Z",
        attestation={"kind": "none", "reason": "x"},
        close_reason=CloseReason.REVOCATION,
    )
    assert "secret-exec" not in repr(summary)


def test_order_is_enforced() -> None:
    """Entries wait for the attestation, session events have their own methods, nothing follows the close."""
    chain = _open()
    with pytest.raises(ValueError, match="attestation"):
        chain.append(AuditEvent.COMPLETED, at=T0)
    with pytest.raises(ValueError, match="attestation"):
        chain.close(CloseReason.SHUTDOWN, at=T0)
    chain.bind_attestation(no_attestation("x"), at=T0)
    with pytest.raises(ValueError, match="directly follows"):
        chain.bind_attestation(no_attestation("x"), at=T0)
    with pytest.raises(ValueError, match="made by"):
        chain.append(AuditEvent.SESSION_OPEN, at=T0)
    close = chain.close(CloseReason.SHUTDOWN, at=T0)
    with pytest.raises(ValueError, match="closed"):
        chain.append(AuditEvent.COMPLETED, at=T0)
    with pytest.raises(ValueError, match="closed"):
        next_entry(close, event=AuditEvent.COMPLETED, at=T0)


def test_attestation_must_bind_this_root() -> None:
    """An attestation record binding another root is refused."""
    genesis = _open().head
    record = {
        "kind": "configfs-tsm",
        "provider": "tdx_guest",
        "generation": 1,
        "report_data": "00" * 64,
        "outblob": "AAAA",
    }
    with pytest.raises(ValueError, match="does not bind"):
        attestation_entry(genesis, record, at=T0)


def test_unhashable_detail_is_refused_when_appended() -> None:
    """A detail with no RFC 8785 form is refused at append, not discovered by a verifier later."""
    chain = _open()
    chain.bind_attestation(no_attestation("x"), at=T0)
    with pytest.raises(ValueError):
        chain.append(AuditEvent.COMPLETED, at=T0, detail={"n": float("nan")})


def test_genesis_needs_its_identities() -> None:
    """A genesis without a session id, agent or key id is refused."""
    with pytest.raises(ValueError):
        make_genesis(session_id="", agent="a", key_id=KEY_ID, at=T0)
    with pytest.raises(ValueError):
        make_genesis(session_id="s", agent="", key_id=KEY_ID, at=T0)
