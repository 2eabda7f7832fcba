"""Agent sessions and credentials in the store (DESIGN sections 1, 2 step 3, 7, 8), on every engine.

Times are injected (``NOW`` and ``later``); races start together on an
``anyio.Event`` and every wait is bounded by ``fail_after``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime, timedelta

import anyio
import pytest
from store_support import NOW, later

from bastion.auth.agent_session import StoreBearerAuth, check_agent_session, token_digest
from bastion.errors import (
    AgentSessionExpired,
    AgentSessionRevoked,
    BastionError,
    Conflict,
    NotDurable,
    Unauthenticated,
)
from bastion.ids import AgentId
from bastion.store.base import AgentSessionRecord, CredentialKind, CredentialRecord, Store
from tests.support.faulty_store import FaultyStore

pytestmark = pytest.mark.anyio

AGENT = AgentId("agent-1")
TTL = timedelta(hours=1)


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


async def new_session(store: Store, *, agent: AgentId = AGENT, now: datetime = NOW) -> AgentSessionRecord:
    return await store.create_agent_session(
        human="ada@example.org",
        agent=agent,
        team="research",
        scopes=frozenset({"tools:read", "notes:write"}),
        now=now,
        expires_at=now + TTL,
    )


async def with_credential(
    store: Store, name: str = "token-1", kind: CredentialKind = CredentialKind.BEARER
) -> tuple[AgentSessionRecord, CredentialRecord]:
    record = await new_session(store)
    credential = await store.add_credential(record.agent_session_id, kind, digest(name), now=NOW)
    return record, credential


# ---------------------------------------------------------------- create, read, list


async def test_created_session_reads_back_whole(store: Store) -> None:
    """A created agent session has every field as given, no revocation, and reads back equal."""
    record = await new_session(store)
    assert record.agent_session_id.startswith("as_")
    assert (record.human, record.agent, record.team) == ("ada@example.org", AGENT, "research")
    assert record.scopes == frozenset({"tools:read", "notes:write"})
    assert (record.created_at, record.expires_at) == (NOW, NOW + TTL)
    assert (record.revoked_at, record.revoked_by, record.revoke_reason) == (None, None, None)
    assert await store.get_agent_session(record.agent_session_id) == record
    assert await store.get_agent_session("as_unknown") is None


async def test_list_is_oldest_first_and_filters_by_agent(store: Store) -> None:
    """list_agent_sessions returns every session oldest first, or only one agent's."""
    first = await new_session(store, now=NOW)
    second = await new_session(store, agent=AgentId("agent-2"), now=later(1))
    third = await new_session(store, now=later(2))
    assert await store.list_agent_sessions() == [first, second, third]
    assert await store.list_agent_sessions(agent=AGENT) == [first, third]
    assert await store.list_agent_sessions(agent=AgentId("nobody")) == []


@pytest.mark.parametrize("expires_in", [timedelta(0), timedelta(seconds=-1)])
async def test_a_session_must_expire_after_it_starts(store: Store, expires_in: timedelta) -> None:
    """An expiry at or before creation is refused before anything is written."""
    with pytest.raises(ValueError, match="expire"):
        await store.create_agent_session(
            human="h", agent=AGENT, team=None, scopes=frozenset(), now=NOW, expires_at=NOW + expires_in
        )
    assert await store.list_agent_sessions() == []


async def test_naive_times_are_refused(store: Store) -> None:
    """Store times are timezone-aware: a naive one is a ValueError."""
    with pytest.raises(ValueError, match="timezone"):
        await store.create_agent_session(
            human="h",
            agent=AGENT,
            team=None,
            scopes=frozenset(),
            now=NOW.replace(tzinfo=None),
            expires_at=NOW.replace(tzinfo=None) + TTL,
        )


# ---------------------------------------------------------------- credentials


@pytest.mark.parametrize("kind", list(CredentialKind))
async def test_a_credential_finds_its_session(store: Store, kind: CredentialKind) -> None:
    """find_credential returns the credential and its agent session, by kind and digest only."""
    record, credential = await with_credential(store, kind=kind)
    assert credential.credential_id.startswith("cred_")
    assert (credential.kind, credential.digest, credential.created_at) == (kind, digest("token-1"), NOW)
    assert (credential.superseded_at, credential.renewed_from) == (None, None)
    assert await store.find_credential(kind, digest("token-1")) == (credential, record)
    other = CredentialKind.MTLS if kind is CredentialKind.BEARER else CredentialKind.BEARER
    assert await store.find_credential(other, digest("token-1")) is None
    assert await store.find_credential(kind, digest("unknown")) is None
    assert await store.list_credentials(record.agent_session_id) == [credential]


@pytest.mark.parametrize("bad", ["", "ABC", digest("x").upper(), digest("x")[:-1], digest("x") + "0"])
async def test_malformed_digest_is_refused(store: Store, bad: str) -> None:
    """A digest that is not 64 lowercase hex digits is a ValueError, for adding and renewing."""
    record, credential = await with_credential(store)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        await store.add_credential(record.agent_session_id, CredentialKind.BEARER, bad, now=NOW)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        await store.renew_credential(credential.credential_id, bad, now=NOW)


async def test_a_digest_is_bound_once_ever(store: Store) -> None:
    """The same (kind, digest) cannot be bound twice, to the same or another agent session."""
    record, _ = await with_credential(store)
    other = await new_session(store)
    for target in (record, other):
        with pytest.raises(Conflict):
            await store.add_credential(
                target.agent_session_id, CredentialKind.BEARER, digest("token-1"), now=NOW
            )


async def test_adding_a_credential_needs_a_usable_session(store: Store) -> None:
    """Unknown: Conflict; revoked: AgentSessionRevoked; expired as of now: AgentSessionExpired."""
    with pytest.raises(Conflict):
        await store.add_credential("as_unknown", CredentialKind.BEARER, digest("a"), now=NOW)
    expiring = await new_session(store)
    with pytest.raises(AgentSessionExpired):
        await store.add_credential(
            expiring.agent_session_id, CredentialKind.BEARER, digest("b"), now=NOW + TTL
        )
    revoked = await new_session(store)
    await store.revoke_agent_session(revoked.agent_session_id, by="ops", reason="test", now=NOW)
    with pytest.raises(AgentSessionRevoked):
        await store.add_credential(revoked.agent_session_id, CredentialKind.BEARER, digest("c"), now=NOW)
    assert await store.list_credentials(expiring.agent_session_id) == []
    assert await store.list_credentials(revoked.agent_session_id) == []


# ---------------------------------------------------------------- revocation


async def test_revocation_is_recorded_once(store: Store) -> None:
    """A second revocation changes nothing: the first one's time, actor and reason stay."""
    record, _ = await with_credential(store)
    first = await store.revoke_agent_session(
        record.agent_session_id, by="alice", reason="leaked", now=later(5)
    )
    assert (first.revoked_at, first.revoked_by, first.revoke_reason) == (later(5), "alice", "leaked")
    second = await store.revoke_agent_session(record.agent_session_id, by="bob", reason="again", now=later(9))
    assert second == first
    assert await store.get_agent_session(record.agent_session_id) == first


async def test_revoked_session_is_refused_through_its_credential(store: Store) -> None:
    """After revocation the credential still resolves, and its session check raises AgentSessionRevoked."""
    record, _ = await with_credential(store)
    await store.revoke_agent_session(record.agent_session_id, by="ops", reason="", now=NOW)
    found = await store.find_credential(CredentialKind.BEARER, digest("token-1"))
    assert found is not None
    with pytest.raises(AgentSessionRevoked):
        check_agent_session(found[1], NOW)


async def test_revoking_unknown_or_without_actor_is_refused(store: Store) -> None:
    """An unknown agent session is a Conflict; a revocation must name who revoked."""
    with pytest.raises(Conflict):
        await store.revoke_agent_session("as_unknown", by="ops", reason="", now=NOW)
    record = await new_session(store)
    with pytest.raises(ValueError):
        await store.revoke_agent_session(record.agent_session_id, by="", reason="", now=NOW)


async def test_an_expired_session_can_be_revoked(store: Store) -> None:
    """Revoking after expiry records the revocation; the check then reports revoked."""
    record = await new_session(store)
    revoked = await store.revoke_agent_session(
        record.agent_session_id, by="ops", reason="late", now=later(7200)
    )
    assert revoked.revoked_at == later(7200)
    with pytest.raises(AgentSessionRevoked):
        check_agent_session(revoked, later(7200))


async def test_revocation_reaches_another_replica(store: Store, replica: Store) -> None:
    """A revocation made through one store is what a second store on the same data reads next."""
    record, _ = await with_credential(store)
    await store.revoke_agent_session(record.agent_session_id, by="ops", reason="r", now=NOW)
    found = await replica.find_credential(CredentialKind.BEARER, digest("token-1"))
    assert found is not None and found[1].revoked_by == "ops"


# ---------------------------------------------------------------- expiry


async def test_expiry_is_decided_by_the_given_time(store: Store) -> None:
    """Active strictly before expires_at, expired from expires_at on."""
    record = await new_session(store)
    check_agent_session(record, NOW)
    check_agent_session(record, NOW + TTL - timedelta(microseconds=1))
    with pytest.raises(AgentSessionExpired):
        check_agent_session(record, NOW + TTL)


# ---------------------------------------------------------------- renewal


@pytest.mark.parametrize("kind", list(CredentialKind))
async def test_renewal_supersedes_the_old_credential(store: Store, kind: CredentialKind) -> None:
    """The old credential is superseded at now; the new one, same kind and session, names it."""
    record, old = await with_credential(store, kind=kind)
    new = await store.renew_credential(old.credential_id, digest("token-2"), now=later(60))
    assert (new.agent_session_id, new.kind, new.digest) == (record.agent_session_id, kind, digest("token-2"))
    assert (new.created_at, new.superseded_at, new.renewed_from) == (later(60), None, old.credential_id)
    found_old = await store.find_credential(kind, digest("token-1"))
    assert found_old is not None and found_old[0].superseded_at == later(60)
    assert await store.find_credential(kind, digest("token-2")) == (new, record)
    # Renewal extends nothing: the agent session is unchanged.
    assert await store.get_agent_session(record.agent_session_id) == record
    assert [c.credential_id for c in await store.list_credentials(record.agent_session_id)] == [
        old.credential_id,
        new.credential_id,
    ]


async def test_a_credential_is_renewed_once(store: Store) -> None:
    """Renewing a superseded credential is a Conflict; so is renewing to a digest used before."""
    _, old = await with_credential(store)
    new = await store.renew_credential(old.credential_id, digest("token-2"), now=NOW)
    with pytest.raises(Conflict):
        await store.renew_credential(old.credential_id, digest("token-3"), now=NOW)
    with pytest.raises(Conflict):
        await store.renew_credential(new.credential_id, digest("token-1"), now=NOW)
    with pytest.raises(Conflict):
        await store.renew_credential("cred_unknown", digest("token-4"), now=NOW)


@pytest.mark.parametrize(
    ("revoke", "at", "error"),
    [(True, NOW, AgentSessionRevoked), (False, NOW + TTL, AgentSessionExpired)],
)
async def test_renewal_needs_a_usable_session(
    store: Store, revoke: bool, at: datetime, error: type[BastionError]
) -> None:
    """A revoked or expired agent session renews nothing, and the old credential stays as it was."""
    record, old = await with_credential(store)
    if revoke:
        await store.revoke_agent_session(record.agent_session_id, by="ops", reason="", now=NOW)
    with pytest.raises(error):
        await store.renew_credential(old.credential_id, digest("token-2"), now=at)
    assert await store.list_credentials(record.agent_session_id) == [old]


async def test_a_failed_renewal_changes_nothing(store: Store) -> None:
    """A renewal that is not durable before commit leaves the old credential current."""
    record, old = await with_credential(store)
    faulty = FaultyStore(store, fail_at="renew_credential", when="before_commit")
    with pytest.raises(NotDurable):
        await faulty.renew_credential(old.credential_id, digest("token-2"), now=NOW)
    assert await store.list_credentials(record.agent_session_id) == [old]


# ---------------------------------------------------------------- races

TASKS = 48


async def test_concurrent_revoke_and_renew_leave_nothing_usable(store: Store, replica: Store) -> None:
    """Many revocations and renewals race on one session: one revocation record, at most one renewal
    per credential, every loser refused with a typed error, and afterwards no credential authenticates."""
    record, old = await with_credential(store)
    start = anyio.Event()
    results: list[object] = []

    async def revoke(i: int) -> None:
        target = store if i % 2 else replica
        results.append(
            await target.revoke_agent_session(
                record.agent_session_id, by=f"op-{i}", reason=str(i), now=later(i)
            )
        )

    async def renew(i: int) -> None:
        target = replica if i % 2 else store
        try:
            results.append(await target.renew_credential(old.credential_id, digest(f"new-{i}"), now=later(i)))
        except BastionError as exc:
            results.append(exc)

    async def one(i: int) -> None:
        await start.wait()
        await (revoke(i) if i % 3 == 0 else renew(i))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for i in range(TASKS):
                tg.start_soon(one, i)
            start.set()

    revocations = {r for r in results if isinstance(r, AgentSessionRecord)}
    assert len(revocations) == 1, "every revoke returns the one first revocation"
    renewals = [r for r in results if isinstance(r, CredentialRecord)]
    assert len(renewals) <= 1
    kinds = Counter(type(r).__name__ for r in results if isinstance(r, BastionError))
    assert set(kinds) <= {"Conflict", "AgentSessionRevoked"}
    assert sum(kinds.values()) + len(renewals) == TASKS - TASKS // 3

    auth = StoreBearerAuth(store)
    for credential in await store.list_credentials(record.agent_session_id):
        found = await store.find_credential(credential.kind, credential.digest)
        assert found is not None
        with pytest.raises((AgentSessionRevoked, Unauthenticated)):
            if found[0].superseded_at is not None:
                raise Unauthenticated()
            check_agent_session(found[1], later(TASKS))
    with pytest.raises((AgentSessionRevoked, Unauthenticated)):
        await auth.authenticate("Bearer token-1", b"", later(TASKS))


# ---------------------------------------------------------------- the authenticator over the store


async def test_bearer_auth_resolves_a_principal(store: Store) -> None:
    """A bound bearer token resolves to the principal of its agent session."""
    token = "bst_" + "x" * 43
    record = await new_session(store)
    credential = await store.add_credential(
        record.agent_session_id, CredentialKind.BEARER, token_digest(token), now=NOW
    )
    principal = await StoreBearerAuth(store).authenticate(f"Bearer {token}", b"", NOW)
    assert principal.agent == AGENT
    assert (principal.agent_session_id, principal.credential_id) == (
        record.agent_session_id,
        credential.credential_id,
    )
    assert (principal.human, principal.team, principal.scopes) == (record.human, record.team, record.scopes)
    assert principal.expires_at == record.expires_at


async def test_bearer_auth_refusals(store: Store) -> None:
    """Unknown, superseded, malformed and query-string credentials: Unauthenticated; the session's
    expiry and revocation: their own typed errors."""
    token, renewed = "tok-" + "a" * 40, "tok-" + "b" * 40
    record = await new_session(store)
    old = await store.add_credential(
        record.agent_session_id, CredentialKind.BEARER, token_digest(token), now=NOW
    )
    auth = StoreBearerAuth(store)
    for header, query in [
        (None, b""),
        ("Basic abc", b""),
        ("Bearer ", b""),
        ("Bearer nope", b""),
        (f"Bearer {token}", b"access_token=" + token.encode()),
    ]:
        with pytest.raises(Unauthenticated) as caught:
            await auth.authenticate(header, query, NOW)
        assert token not in caught.value.message
    with pytest.raises(AgentSessionExpired):
        await auth.authenticate(f"Bearer {token}", b"", NOW + TTL)
    await store.renew_credential(old.credential_id, token_digest(renewed), now=NOW)
    with pytest.raises(Unauthenticated) as superseded:
        await auth.authenticate(f"Bearer {token}", b"", NOW)
    assert superseded.value.cause == "superseded"
    assert (await auth.authenticate(f"Bearer {renewed}", b"", NOW)).agent == AGENT
    await store.revoke_agent_session(record.agent_session_id, by="ops", reason="", now=NOW)
    with pytest.raises(AgentSessionRevoked):
        await auth.authenticate(f"Bearer {renewed}", b"", NOW)


async def test_certificate_auth_uses_the_mtls_kind(store: Store) -> None:
    """A fingerprint resolves only as an mtls credential; colons and case do not matter."""
    fingerprint = digest("certificate-der")
    record = await new_session(store)
    await store.add_credential(record.agent_session_id, CredentialKind.MTLS, fingerprint, now=NOW)
    auth = StoreBearerAuth(store)
    colon_form = ":".join(fingerprint[i : i + 2] for i in range(0, 64, 2)).upper()
    assert (await auth.principal_for_certificate(colon_form, NOW)).agent_session_id == record.agent_session_id
    with pytest.raises(Unauthenticated):
        await auth.principal_for_certificate("not-a-fingerprint", NOW)
    with pytest.raises(Unauthenticated):
        await auth.principal_for_certificate(digest("other"), NOW)
