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

Speed matters (``bastion verify`` must pass 200,000 entries/s on one core).
Steps 1 and 2 run in C for the common line: ``msgspec`` decodes it into the
entry's fields with their exact types and encodes it back with sorted keys,
which is RFC 8785 for the plain shapes entries have (strings, safe integers,
booleans, null, ASCII keys: ``tests/unit/audit/test_walk_reader.py`` holds the
two equal); a line it refuses or does not reproduce byte for byte takes the
reference path (``orjson`` and ``crypto/jcs.py``), which names the defect.
Step 2 proves the line is the canonical form, so step 5 hashes the line's own
bytes with the ``hash`` member cut out instead of serializing again.
``fanout.py`` splits one file across processes, each walking a
:class:`Stretch` of it with :func:`walk_lines`.

Memory stays flat in the bundle's size: lines are read in blocks and only the
genesis, the attestation entry and the current entry are held (plus the
matches of a join). Nothing here opens a socket or a database.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import msgspec
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
_EVENTS = frozenset(event.value for event in AuditEvent)
_OPEN = AuditEvent.SESSION_OPEN.value
_CLOSE = AuditEvent.SESSION_CLOSE.value
_CLOSE_REASONS = frozenset(reason.value for reason in CloseReason)
_KEY_ID_RE = re.compile(r"[A-Za-z0-9_-]{43}")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_HASH_MEMBER = b',"hash":"'
_HASH_MEMBER_LEN = len(_HASH_MEMBER) + 64 + 1  # ',"hash":"' + 64 hex digits + '"'
_SORT = orjson.OPT_SORT_KEYS


class _Line(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One bundle line's fields with their exact types, declared in RFC 8785 (code point) order."""

    agent: str | None
    args_digest: str | None
    binding: str | None
    call_id: str | None
    decision: str | None
    detail: dict[str, Any] | None
    epoch: int | None
    event: str
    execution_id: str | None
    hash: str
    outcome: str | None
    policy_version: str | None
    prev: str
    reason: str | None
    seq: int
    server: str | None
    session_id: str
    tool: str | None
    ts: str
    worker: str | None
    workflow_id: str | None


if _Line.__struct_fields__ != tuple(sorted(ENTRY_FIELDS)):  # pragma: no cover - guards entry.py
    raise ImportError("AuditEntry's fields changed; update walk._Line")
_decode_line = msgspec.json.Decoder(_Line).decode
# Keys sorted (detail's too): for strings, safe integers, booleans and null under ASCII keys this
# is the RFC 8785 form, as for orjson (crypto/jcs.py); tests/unit/audit hold the two equal.
_encode_line = msgspec.json.Encoder(order="sorted").encode
_as_dict = msgspec.structs.asdict


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
    decode, encode, sha256, ts_match = _decode_line, _encode_line, hashlib.sha256, TS_RE.fullmatch
    events = _EVENTS
    expected_seq, prev_hash, prev_digest = 0, GENESIS_PREV, bytes(32)
    out = Stretch()
    matches = out.matches
    session_id = ""
    closed = False
    entry: _Line | None = None
    lineno = 0
    for lineno, raw in enumerate(lines, start=1):
        content = raw[:-1] if raw[-1:] == b"\n" else raw
        # (1) and (2), the common case in C: msgspec reads the line into the entry's fields, each
        # of its exact type, and writes it back (keys sorted, RFC 8785 for these plain shapes)
        # byte for byte. Any other line takes the reference path, which says what is wrong.
        try:
            entry = decode(content)
        except msgspec.MsgspecError:
            entry = None
        if (
            entry is not None
            and (entry.detail is None or is_plain_json(entry.detail))
            and encode(entry) == content
        ):
            epoch = entry.epoch
            if not (
                0 <= entry.seq <= MAX_SAFE_INTEGER
                and (epoch is None or 0 <= epoch <= MAX_SAFE_INTEGER)
                and entry.event in events
                and ts_match(entry.ts)
            ):
                _check_scalars(entry, line=lineno, source=source)  # raises, naming the defect
        else:
            entry = _read_strict(content, line=lineno, source=source)
        seq, prev, stated, event, entry_session = (
            entry.seq,
            entry.prev,
            entry.hash,
            entry.event,
            entry.session_id,
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
            out.genesis, session_id = _as_dict(entry), entry_session
            _check_genesis(out.genesis, line=lineno, source=source)
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
                out.attestation = _as_dict(entry)
                _check_attestation_entry(out.attestation, prev, line=lineno, source=source)
            elif event == _OPEN:
                raise LifecycleViolation(
                    "session_open after the attestation entry", line=lineno, seq=seq, source=source
                )
            if event == _CLOSE:
                _check_close_entry(_as_dict(entry), line=lineno, source=source)
                closed = True
        if execution_id is not None and entry.execution_id == execution_id:
            matches.append((lineno, _as_dict(entry)))
        expected_seq = seq + 1
    out.count, out.session_id, out.closed = lineno, session_id, closed
    out.last = None if entry is None else _as_dict(entry)
    return out


def _read_strict(content: bytes, *, line: int, source: str | None) -> _Line:
    """Steps (1) and (2) by the reference path: the entry, or the defect that names what is wrong."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise MalformedEntry(f"not JSON: {exc}", line=line, source=source) from None
    if type(data) is not dict or len(data) != _N_FIELDS or data.keys() != _FIELD_SET:
        raise MalformedEntry(_field_defect(data), line=line, source=source)
    defect = _type_defect(data)
    if defect is not None:
        raise MalformedEntry(defect, line=line, seq=_int_or_none(data["seq"]), source=source)
    entry = _Line(**data)
    _check_scalars(entry, line=line, source=source)
    detail = data["detail"]
    if detail is None or is_plain_json(detail):
        canonical = orjson.dumps(data, option=_SORT)
    else:
        try:
            canonical = canonical_json(data)
        except (CanonicalizationError, UnicodeError) as exc:
            raise NotCanonical(
                f"entry has no RFC 8785 form: {exc}", line=line, seq=entry.seq, source=source
            ) from None
    if canonical != content:
        raise NotCanonical(
            "line is not the RFC 8785 canonical form of its entry", line=line, seq=entry.seq, source=source
        )
    return entry


def _check_scalars(entry: _Line, *, line: int, source: str | None) -> None:
    seq, epoch = entry.seq, entry.epoch
    if not 0 <= seq <= MAX_SAFE_INTEGER:
        raise MalformedEntry("seq is not a non-negative safe integer", line=line, source=source)
    if epoch is not None and not 0 <= epoch <= MAX_SAFE_INTEGER:
        raise MalformedEntry(
            "epoch is not null or a non-negative safe integer", line=line, seq=seq, source=source
        )
    if entry.event not in _EVENTS:
        raise MalformedEntry(f"unknown event {entry.event!r}", line=line, seq=seq, source=source)
    if not TS_RE.fullmatch(entry.ts):
        raise MalformedEntry("ts is not RFC 3339 UTC with microseconds", line=line, seq=seq, source=source)


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
