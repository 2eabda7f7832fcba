"""Shared builders for the audit tests: a keyring, a closed chain, its bundle and claim."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bastion.audit.chain import ChainBuilder, ChainSummary, CloseReason
from bastion.audit.claim import ClaimProfile, PolicyInForce, issue_claim
from bastion.audit.entry import AuditEntry, AuditEvent
from bastion.audit.export import claim_bytes, entry_line
from bastion.audit.tee import no_attestation
from bastion.crypto.keys import Keyring

VECTORS = Path(__file__).resolve().parents[2] / "vectors"
PROFILE = ClaimProfile(
    trust_domain="bastion.test", issuer="spiffe://bastion.test/gateway", build_digest="sha256:" + "ab" * 32
)
POLICY = PolicyInForce(bundle_hash="sha256:" + "cd" * 32, version="7")


@dataclass
class Evidence:
    """One closed evidence session as files: its entries, bundle, claim and key."""

    keyring: Keyring
    entries: list[AuditEntry]
    claim: dict[str, Any]
    bundle_path: Path
    claim_path: Path
    key_path: Path

    @property
    def summary(self) -> ChainSummary:
        return ChainSummary.of(self.entries[0], self.entries[1], self.entries[-1])


def build_chain(
    key_id: str,
    *,
    session_id: str = "ev_11112222333344445555666677778888",
    agent: str = "agent-bob",
    calls: int = 3,
    execution_ids: tuple[str | None, ...] = ("exec-1", None, "exec-2"),
    start: datetime | None = None,
    attestation: dict[str, Any] | None = None,
) -> list[AuditEntry]:
    """A closed chain: genesis, attestation, ``calls`` completed calls, close."""
    at = start or datetime.now(UTC)
    chain = ChainBuilder.open(session_id=session_id, agent=agent, key_id=key_id, at=at)
    chain.bind_attestation(attestation or no_attestation("no TEE in tests"), at=at)
    for index in range(calls):
        chain.append(
            AuditEvent.COMPLETED,
            at=at + timedelta(milliseconds=index + 1),
            call_id=f"call_{index:024x}",
            execution_id=execution_ids[index % len(execution_ids)],
            server="files",
            tool="read_file",
            binding="ab" * 32,
            outcome="completed",
            worker="worker-1",
            epoch=1,
        )
    chain.close(CloseReason.IDLE_EXPIRY, at=at + timedelta(milliseconds=calls + 1))
    return list(chain.entries)


def write_evidence(tmp: Path, keyring: Keyring, entries: list[AuditEntry], name: str = "session") -> Evidence:
    summary = ChainSummary.of(entries[0], entries[1], entries[-1])
    claim = issue_claim(summary, profile=PROFILE, policy=POLICY, keyring=keyring, issued_at=datetime.now(UTC))
    bundle_path, claim_path, key_path = tmp / f"{name}.jsonl", tmp / f"{name}.claim.json", tmp / f"{name}.pem"
    bundle_path.write_bytes(b"".join(entry_line(entry) for entry in entries))
    claim_path.write_bytes(claim_bytes(claim))
    key_path.write_bytes(keyring.active.to_pem())
    return Evidence(keyring, entries, claim, bundle_path, claim_path, key_path)


@pytest.fixture
def keyring(tmp_path: Path) -> Keyring:
    return Keyring.open(tmp_path / "data")


@pytest.fixture
def evidence(tmp_path: Path, keyring: Keyring) -> Evidence:
    return write_evidence(tmp_path, keyring, build_chain(keyring.key_id))


@pytest.fixture(scope="session")
def vector_maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_audit_vectors", VECTORS / "make_audit_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def make_chain() -> Any:
    """:func:`build_chain`, for tests that need their own chain."""
    return build_chain


@pytest.fixture
def make_evidence(tmp_path: Path) -> Any:
    """:func:`write_evidence` into ``tmp_path``."""

    def make(keyring: Keyring, entries: list[AuditEntry], name: str = "session") -> Evidence:
        return write_evidence(tmp_path, keyring, entries, name)

    return make
