"""The streaming line checker behind the offline verifier (DESIGN sections 4 and 10).

``verify.py`` owns the rules' public face; this module owns the hot loop. A
bundle is checked line by line (1-based), in this order:

1. the line is a UTF-8 JSON object with exactly the entry fields
   (``entry.ENTRY_FIELDS``), each of its type;
2. the line is byte for byte the RFC 8785 form of that object (``export.py``
   writes nothing else, so no changed byte goes unnoticed);
3. ``seq`` is the previous ``seq + 1``, from 0;
4. ``prev`` is the previous ``hash`` (64 zeros for the genesis);
5. ``hash`` is ``SHA-256(prev || JCS(entry without hash))``;
6. the chain's shape holds (``chain.py``): line 1 is the genesis, line 2 the
   attestation entry binding the root, no ``session_open`` after it, every
   entry of the genesis's session, nothing after a ``session_close``.

The first failing check raises a :class:`~bastion.audit.errors.BundleDefect`
naming the line, the seq and the defect.

Hashing is the cost (``bastion verify`` must pass 200,000 entries/s). Step 2
already proves the line is the canonical form, so step 5 hashes the line's own
bytes with the ``hash`` member cut out instead of serializing again; step 2
compares with ``orjson``'s sorted output, which is RFC 8785 for the plain
shapes entries have (``crypto/jcs.py``), and uses the reference implementation
for anything else. ``fanout.py`` splits one file across processes, each
walking a :class:`Stretch` of it with :func:`walk_lines`.

Memory stays flat in the bundle's size: lines are read in blocks and only the
genesis, the attestation entry and the current entry are held (plus the
matches of a join). Nothing here opens a socket or a database.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, BinaryIO

import orjson

from bastion.audit.chain import ATTESTATION_SEQ, GENESIS_SEQ, ChainSummary, CloseReason
from bastion.audit.entry import ENTRY_FIELDS, GENESIS_PREV, TS_RE, AuditEvent
from bastion.audit.errors import (
    AttestationInvalid,
    BrokenLink,
    EmptyBundle,
    GenesisInvalid,
    HashMismatch,
    LifecycleViolation,
    MalformedEntry,
    NotCanonical,
    SequenceGap,
    SessionMismatch,
)
from bastion.audit.tee import check_attestation_record
from bastion.crypto.jcs import MAX_SAFE_INTEGER, CanonicalizationError, canonical_json, is_plain_json

__all__ = ["MAX_LINE", "Stretch", "read_lines", "summarize", "walk_lines"]

#: The longest bundle line accepted; an entry with the largest attestation report is under 100 KiB.
MAX_LINE = 1 << 22
_BLOCK = 1 << 18

_FIELD_SET = frozenset(ENTRY_FIELDS)
_N_FIELDS = len(ENTRY_FIELDS)
_OPTIONAL_STR = (
    "call_id",
    "workflow_id",
    "execution_id",
    "agent",
    "server",
    "tool",
    "args_digest",
    "binding",
    "decision",
    "reason",
    "outcome",
    "policy_version",
    "worker",
)
_REQUIRED_STR = ("ts", "session_id", "event", "prev", "hash")
_CALL_FIELDS = (
    "call_id",
    "workflow_id",
    "execution_id",
    "server",
    "tool",
    "args_digest",
    "binding",
    "decision",
    "reason",
    "outcome",
)
# The keys as orjson hands them out (it caches short keys), so comparing a parsed entry's keys
# with these mostly finds the very same objects.
_SORTED_FIELDS = tuple(orjson.loads(orjson.dumps(dict.fromkeys(sorted(ENTRY_FIELDS)))))
_get_sorted = itemgetter(*_SORTED_FIELDS)
# walk_lines unpacks the fields by position in key order, so that order is pinned here.
_UNPACKED_ORDER = (
    "agent",
    "args_digest",
    "binding",
    "call_id",
    "decision",
    "detail",
    "epoch",
    "event",
    "execution_id",
    "hash",
    "outcome",
    "policy_version",
    "prev",
    "reason",
    "seq",
    "server",
    "session_id",
    "tool",
    "ts",
    "worker",
    "workflow_id",
)
if _SORTED_FIELDS != _UNPACKED_ORDER:  # pragma: no cover - guards a change to entry.py
    raise ImportError("AuditEntry's fields changed; update walk_lines' unpacking")
_EVENTS = frozenset(event.value for event in AuditEvent)
_OPEN = AuditEvent.SESSION_OPEN.value
_CLOSE = AuditEvent.SESSION_CLOSE.value
_CLOSE_REASONS = frozenset(reason.value for reason in CloseReason)
_KEY_ID_RE = re.compile(r"[A-Za-z0-9_-]{43}")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_HASH_MEMBER = b',"hash":"'
_HASH_MEMBER_LEN = len(_HASH_MEMBER) + 64 + 1  # ',"hash":"' + 64 hex digits + '"'
_SORT = orjson.OPT_SORT_KEYS


@dataclass(slots=True)
class Stretch:
    """What a run of consecutive, individually sound lines showed.

    A walk from the genesis has ``first_seq == 0``; a stretch from the middle
    of a file (``walk_lines(..., from_genesis=False)``) takes its start from
    its first line, and its seams are checked by whoever joins stretches.
    """

    count: int = 0
    first_seq: int = -1
    first_prev: str = ""
    last: dict[str, Any] | None = None
    session_id: str = ""
    genesis: dict[str, Any] | None = None
    attestation: dict[str, Any] | None = None
    closed: bool = False
    matches: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


def read_lines(handle: BinaryIO, *, limit: int | None = None, source: str | None = None) -> Iterator[bytes]:
    """The lines of a bundle file, without their ``\\n``, read in blocks.

    Reads at most ``limit`` bytes when given. Memory is bounded by the block
    and :data:`MAX_LINE` whatever the file holds; a longer line raises
    :class:`MalformedEntry` naming it.
    """
    pending = b""
    count = 0
    left = limit
    while True:
        block = handle.read(_BLOCK if left is None else min(_BLOCK, left))
        if not block:
            break
        if left is not None:
            left -= len(block)
        parts = (pending + block).split(b"\n") if pending else block.split(b"\n")
        pending = parts.pop()
        if len(pending) > MAX_LINE:
            raise MalformedEntry(
                f"line is longer than {MAX_LINE} bytes", line=count + len(parts) + 1, source=source
            )
        count += len(parts)
        yield from parts
    if pending:
        yield pending


def summarize(stretch: Stretch, *, source: str | None = None) -> ChainSummary:
    """The chain summary of a whole walk; raises :class:`EmptyBundle` for no lines."""
    genesis, last, attestation = stretch.genesis, stretch.last, stretch.attestation
    if genesis is None or last is None:
        raise EmptyBundle("the bundle has no entries", source=source)
    return ChainSummary(
        session_id=stretch.session_id,
        agent=genesis["agent"],
        key_id=genesis["detail"]["key_id"],
        root=genesis["hash"],
        head=last["hash"],
        entry_count=last["seq"] + 1,
        first_ts=genesis["ts"],
        last_ts=last["ts"],
        attestation=attestation["detail"]["attestation"] if attestation is not None else None,
        close_reason=CloseReason(last["detail"]["close_reason"]) if stretch.closed else None,
    )


def walk_lines(
    lines: Iterable[bytes],
    *,
    source: str | None = None,
    execution_id: str | None = None,
    from_genesis: bool = True,
) -> Stretch:
    """Check every line (steps 1 to 6); raises a :class:`BundleDefect` for the first bad one.

    Lines may end in ``\\n`` or not. With ``execution_id``, the entries that
    carry it are kept in ``matches``.
    """
    loads, dumps, sha256, ts_match, get_sorted = (
        orjson.loads,
        orjson.dumps,
        hashlib.sha256,
        TS_RE.fullmatch,
        _get_sorted,
    )
    events, n_fields, field_set, sorted_fields = _EVENTS, _N_FIELDS, _FIELD_SET, _SORTED_FIELDS
    good_signatures: set[tuple[type, ...]] = set()
    last_signature: tuple[type, ...] = ()
    expected_seq, prev_hash, prev_digest = 0, GENESIS_PREV, bytes(32)
    out = Stretch()
    matches = out.matches
    session_id = ""
    closed = False
    data: dict[str, Any] | None = None
    lineno = 0
    for lineno, raw in enumerate(lines, start=1):
        content = raw[:-1] if raw[-1:] == b"\n" else raw
        # (1) A JSON object with exactly the entry fields, each of its type.
        try:
            data = loads(content)
        except orjson.JSONDecodeError as exc:
            raise MalformedEntry(f"not JSON: {exc}", line=lineno, source=source) from None
        if type(data) is not dict:
            raise MalformedEntry(_field_defect(data), line=lineno, source=source)
        in_order = tuple(data) == sorted_fields
        if in_order:
            values = data.values()  # unpacked in place below, no tuple made
        elif len(data) == n_fields and data.keys() == field_set:
            values = get_sorted(data)  # out of order: step (2) below reports it
        else:
            raise MalformedEntry(_field_defect(data), line=lineno, source=source)
        # Exact types, checked once per distinct combination (at most 2**15 of them).
        signature = tuple(map(type, values))
        if signature != last_signature and signature not in good_signatures:
            defect = _type_defect(data)
            if defect is not None:
                raise MalformedEntry(defect, line=lineno, seq=_int_or_none(data["seq"]), source=source)
            good_signatures.add(signature)
        last_signature = signature
        # The fields in key order (RFC 8785 order: code points, all ASCII).
        (
            _,
            _,
            _,
            _,
            _,
            detail,
            epoch,
            event,
            entry_execution,
            stated,
            _,
            _,
            prev,
            _,
            seq,
            _,
            entry_session,
            _,
            ts,
            _,
            _,
        ) = values
        if not 0 <= seq <= MAX_SAFE_INTEGER:
            raise MalformedEntry("seq is not a non-negative safe integer", line=lineno, source=source)
        if epoch is not None and not 0 <= epoch <= MAX_SAFE_INTEGER:
            raise MalformedEntry(
                "epoch is not null or a non-negative safe integer", line=lineno, seq=seq, source=source
            )
        if event not in events:
            raise MalformedEntry(f"unknown event {event!r}", line=lineno, seq=seq, source=source)
        if not ts_match(ts):
            raise MalformedEntry(
                "ts is not RFC 3339 UTC with microseconds", line=lineno, seq=seq, source=source
            )
        # (2) Byte for byte the RFC 8785 form. With the top-level keys already in order and
        # no nested object, orjson's output in the dict's order is the sorted one.
        if detail is None and in_order:
            canonical = dumps(data)
        elif detail is None or is_plain_json(detail):
            canonical = dumps(data, option=_SORT)
        else:
            try:
                canonical = canonical_json(data)
            except (CanonicalizationError, UnicodeError) as exc:
                raise NotCanonical(
                    f"entry has no RFC 8785 form: {exc}", line=lineno, seq=seq, source=source
                ) from None
        if canonical != content:
            raise NotCanonical(
                "line is not the RFC 8785 canonical form of its entry", line=lineno, seq=seq, source=source
            )
        if lineno == 1:
            out.first_seq, out.first_prev = seq, prev
            if not from_genesis:
                # A stretch from the middle starts where its first line says; the seams are checked later.
                if not _HEX64_RE.fullmatch(prev):
                    raise BrokenLink(f"prev {prev!r} is not a hash", line=lineno, seq=seq, source=source)
                expected_seq, prev_hash, prev_digest = seq, prev, bytes.fromhex(prev)
                session_id = entry_session
        # (3) Continuity.
        if seq != expected_seq:
            raise SequenceGap(f"expected seq {expected_seq}", line=lineno, seq=seq, source=source)
        # (4) The link.
        if prev != prev_hash:
            what = "64 zeros" if seq == GENESIS_SEQ else f"the hash of seq {seq - 1} ({prev_hash})"
            raise BrokenLink(f"prev {prev} is not {what}", line=lineno, seq=seq, source=source)
        # (5) The hash: canonical bytes without the hash member. After (2) the
        # last ',"hash":"' is the top-level member: every member after it in key
        # order is a scalar, and string contents never hold an unescaped quote.
        cut = content.rfind(_HASH_MEMBER)
        hashing = sha256(prev_digest)
        hashing.update(content[:cut])
        hashing.update(content[cut + _HASH_MEMBER_LEN :])
        digest = hashing.digest()
        computed = digest.hex()
        if computed != stated:
            raise HashMismatch(
                f"hash {stated} is not the entry's hash {computed}", line=lineno, seq=seq, source=source
            )
        prev_digest, prev_hash = digest, computed
        # (6) The shape of the chain.
        if closed:
            raise LifecycleViolation(
                "entry after the session_close entry", line=lineno, seq=seq, source=source
            )
        if seq == GENESIS_SEQ:
            _check_genesis(data, line=lineno, source=source)
            out.genesis, session_id = data, entry_session
        else:
            if entry_session != session_id:
                raise SessionMismatch(
                    f"entry of session {entry_session!r} in the chain of {session_id!r}",
                    line=lineno,
                    seq=seq,
                    source=source,
                )
            if seq == ATTESTATION_SEQ:
                # prev is the root: (4) held it to the genesis hash, or the seam check will.
                _check_attestation_entry(data, prev, line=lineno, source=source)
                out.attestation = data
            elif event == _OPEN:
                raise LifecycleViolation(
                    "session_open after the attestation entry", line=lineno, seq=seq, source=source
                )
            if event == _CLOSE:
                _check_close_entry(data, line=lineno, source=source)
                closed = True
        if execution_id is not None and entry_execution == execution_id:
            matches.append((lineno, data))
        expected_seq = seq + 1
    out.count, out.last, out.session_id, out.closed = lineno, data, session_id, closed
    return out


def _check_genesis(data: dict[str, Any], *, line: int, source: str | None) -> None:
    def bad(why: str) -> GenesisInvalid:
        return GenesisInvalid(why, line=line, seq=GENESIS_SEQ, source=source)

    if data["event"] != _OPEN:
        raise bad(f"the genesis event is {data['event']!r}, not {_OPEN!r}")
    if not data["session_id"] or not data["agent"]:
        raise bad("the genesis names no session or no agent")
    set_fields = [name for name in _CALL_FIELDS if data[name] is not None]
    if set_fields:
        raise bad(f"the genesis carries call fields {set_fields}")
    detail = data["detail"]
    if not isinstance(detail, dict) or detail.keys() != {"key_id", "nonce"}:
        raise bad("the genesis detail is not exactly {key_id, nonce}")
    if not isinstance(detail["key_id"], str) or not _KEY_ID_RE.fullmatch(detail["key_id"]):
        raise bad("the genesis key_id is not a key id")
    if not isinstance(detail["nonce"], str) or len(detail["nonce"]) < 22:
        raise bad("the genesis nonce is missing or shorter than 128 bits")


def _check_attestation_entry(data: dict[str, Any], root: str, *, line: int, source: str | None) -> None:
    def bad(why: str) -> AttestationInvalid:
        return AttestationInvalid(why, line=line, seq=ATTESTATION_SEQ, source=source)

    detail = data["detail"]
    if data["event"] != _OPEN or not isinstance(detail, dict) or detail.keys() != {"attestation"}:
        raise bad("line 2 is not the attestation entry (session_open with detail {attestation})")
    try:
        check_attestation_record(detail["attestation"], root)
    except ValueError as exc:
        raise bad(str(exc)) from None


def _check_close_entry(data: dict[str, Any], *, line: int, source: str | None) -> None:
    detail = data["detail"]
    if (
        not isinstance(detail, dict)
        or detail.keys() != {"close_reason"}
        or detail["close_reason"] not in _CLOSE_REASONS
    ):
        raise MalformedEntry(
            "session_close detail is not {close_reason: <known reason>}",
            line=line,
            seq=data["seq"],
            source=source,
        )


def _field_defect(data: Any) -> str:
    if type(data) is not dict:
        return f"line is a JSON {type(data).__name__}, not an object"
    missing = sorted(_FIELD_SET - data.keys())
    extra = sorted(data.keys() - _FIELD_SET)
    return f"entry fields differ: missing={missing} extra={extra}"


def _type_defect(data: dict[str, Any]) -> str | None:
    """What is wrong with the types of an entry's fields, or ``None`` when nothing is."""
    if type(data["seq"]) is not int:
        return "seq is not an integer"
    if data["epoch"] is not None and type(data["epoch"]) is not int:
        return "epoch is not null or an integer"
    if data["detail"] is not None and type(data["detail"]) is not dict:
        return "detail is not null or an object"
    for name in _OPTIONAL_STR:
        if data[name] is not None and type(data[name]) is not str:
            return f"{name} is not null or a string"
    for name in _REQUIRED_STR:
        if type(data[name]) is not str:
            return f"{name} is not a string"
    return None


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None
