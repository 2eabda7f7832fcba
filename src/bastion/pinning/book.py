"""Admitting an upstream's definitions against their pins (issue 27).

Owns: for one server and one kind (tools, prompts), turning the entries a
listing produced into the entries clients may see, whenever a catalog is
built (start, ``tools/list`` for a client's view, ``list_changed``,
reconnect). Per entry, by the server's ``pinning``:

1. ``off``: the entry as listed.
2. Its pinned form and digest (``pinning/digest.py``); a definition with no
   digest (too large, no RFC 8785 form) is left out.
3. The pin: ``tofu`` reads the store (cached per server until a decision
   reaches this replica: :meth:`PinBook.forget`); the first definition seen is
   pinned, insert-if-absent, so replicas agree on one. ``lock`` reads the lock
   file; a definition not in it is refused (left out).
4. Equal to the pin: the entry as listed. Otherwise the change is offered to
   the store (both definitions kept) and reported once per digest
   (``on_change``: the audit entry, with both digests), and the entry is
   withheld (the pinned definition, ``ToolEntry.withheld`` set: calls refused
   with ``definition_changed``) or hidden, per ``pin_changed``.

A store that fails keeps what the cache proves: an entry with no known pin is
left out until the store answers (fail closed). Never raises.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio

from bastion.errors import ConfigError, DefinitionChanged, StoreError
from bastion.pinning.digest import DefinitionUnpinnable, definition_digest, pinned_form
from bastion.pinning.lockfile import LockedPin, read_lock_file
from bastion.pinning.modes import PinChanged, PinMode
from bastion.policy.snapshot import ServerSpec
from bastion.store.pins import PinKind, PinStore
from bastion.upstream.catalog import ToolEntry

__all__ = ["DefinitionChange", "PinBook", "check_not_withheld"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DefinitionChange:
    """A definition that differs from its pin (or, in lock mode, is not in the lock file)."""

    server: str
    kind: PinKind
    name: str
    pinned_digest: str | None  # None: not in the lock file
    offered_digest: str
    mode: PinMode
    action: str  # "withheld", "hidden" or "refused"

    def describe(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "kind": self.kind.value,
            "name": self.name,
            "pinned_digest": self.pinned_digest,
            "offered_digest": self.offered_digest,
            "pinning": self.mode.value,
            "action": self.action,
        }


OnChange = Callable[[DefinitionChange], Awaitable[None]]


def check_not_withheld(entry: ToolEntry) -> None:
    """Raises :class:`DefinitionChanged` for an entry that stands in for a changed definition."""
    if entry.withheld is not None:
        raise DefinitionChanged(tool=entry.exposed_name, cause=f"offered digest {entry.withheld}")


class PinBook:
    """The pins one gateway enforces: the store's (``tofu``) and the lock files' (``lock``)."""

    def __init__(
        self,
        servers: Callable[[], Mapping[str, ServerSpec]],
        store: PinStore | None,
        *,
        locks: Mapping[str, Mapping[tuple[PinKind, str], LockedPin]] | None = None,
        on_change: OnChange | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._servers = servers
        self._store = store
        self._locks = dict(locks or {})
        # Per lock-mode server, the lock file as last read (path, mtime, size): read again when it changes.
        self._lock_seen: dict[str, tuple[str, int, int] | None] = {}
        self._on_change = on_change
        self._clock = clock
        # Per server, what the store held when last read: (kind, name) -> (digest, definition).
        self._cache: dict[str, dict[tuple[PinKind, str], tuple[str, Mapping[str, Any]]]] = {}
        # Changes reported here already (server, kind, name, offered digest): one audit entry each.
        self._reported: set[tuple[str, PinKind, str, str]] = set()

    @classmethod
    def for_servers(
        cls,
        servers: Callable[[], Mapping[str, ServerSpec]],
        store: PinStore | None,
        *,
        on_change: OnChange | None = None,
    ) -> PinBook:
        """The book of these servers, their lock files read now. Raises :class:`ConfigError` (one line)."""
        locks: dict[str, Mapping[tuple[PinKind, str], LockedPin]] = {}
        seen: dict[str, tuple[str, int, int] | None] = {}
        for name, spec in servers().items():
            if spec.pinning is PinMode.LOCK and spec.pin_lock_file is not None:
                seen[name] = _file_seen(Path(spec.pin_lock_file))
                locks[name] = read_lock_file(Path(spec.pin_lock_file)).get(name, {})
        book = cls(servers, store, locks=locks, on_change=on_change)
        book._lock_seen.update(seen)
        return book

    def mode_of(self, server: str) -> PinMode:
        """How ``server``'s definitions are pinned now (``off`` for a server no longer configured)."""
        spec = self._servers().get(server)
        return PinMode.OFF if spec is None else spec.pinning

    def forget(self, server: str) -> None:
        """A decision about ``server`` was made (here or at a replica): read its pins again."""
        self._cache.pop(server, None)

    async def admit(self, server: str, kind: PinKind, entries: Sequence[ToolEntry]) -> list[ToolEntry]:
        spec = self._servers().get(server)
        mode = self.mode_of(server)
        if mode is PinMode.OFF:  # (1)
            return list(entries)
        assert spec is not None
        formed: list[tuple[ToolEntry, dict[str, Any], str]] = []
        for entry in entries:
            try:  # (2)
                form = pinned_form(kind, entry.definition, entry.upstream_name)
                formed.append((entry, form, definition_digest(form)))
            except DefinitionUnpinnable as exc:
                logger.warning(
                    "upstream %s: %s %r left out, its definition cannot be pinned: %s",
                    server, kind.value, entry.upstream_name, exc,
                )  # fmt: skip
        if mode is PinMode.TOFU:
            await self._pin_first_uses(server, kind, formed)
        elif mode is PinMode.LOCK:
            self._read_lock_if_changed(server, spec)
        admitted: list[ToolEntry] = []
        for entry, form, digest in formed:
            pin = await self._pin_of(server, kind, entry.upstream_name, digest, form, mode)  # (3)
            if pin is None:
                continue
            if pin[0] == digest:  # (4)
                admitted.append(entry)
                continue
            withheld = (
                self._withheld(entry, pin[1], digest) if spec.pin_changed is PinChanged.WITHHOLD else None
            )
            await self._changed(server, kind, entry.upstream_name, pin[0], digest, form, mode, withheld)
            if withheld is not None:
                admitted.append(withheld)
        return admitted

    def _read_lock_if_changed(self, server: str, spec: ServerSpec) -> None:
        """Read ``server``'s lock file again if it changed since (``bastion pin`` rewrote it)."""
        if spec.pin_lock_file is None:
            return
        path = Path(spec.pin_lock_file)
        seen = _file_seen(path)
        if server in self._lock_seen and self._lock_seen[server] == seen:
            return
        self._lock_seen[server] = seen
        try:
            self._locks[server] = read_lock_file(path).get(server, {})
        except ConfigError as exc:  # fail closed: nothing of this server until the file is fixed
            logger.error(
                "upstream %s: pin lock file unusable, its definitions are refused: %s", server, exc.message
            )
            self._locks[server] = {}

    async def _pin_first_uses(
        self, server: str, kind: PinKind, formed: Sequence[tuple[ToolEntry, dict[str, Any], str]]
    ) -> None:
        """Pin every definition not pinned yet at once: concurrent writes share the store's group commit."""
        cached = await self._cached(server)
        if cached is None or self._store is None:
            return
        store, unknown = self._store, [f for f in formed if (kind, f[0].upstream_name) not in cached]

        async def pin(name: str, digest: str, form: dict[str, Any]) -> None:
            try:
                held = await store.pin_first(server, kind, name, digest, form, now=self._clock())
            except StoreError:
                return  # left to _pin_of, which tries once more and leaves it out
            cached[(kind, name)] = (held.digest, MappingProxyType(held.definition))

        async with anyio.create_task_group() as tg:
            for entry, form, digest in unknown:
                tg.start_soon(pin, entry.upstream_name, digest, form)

    async def _pin_of(
        self, server: str, kind: PinKind, name: str, digest: str, form: dict[str, Any], mode: PinMode
    ) -> tuple[str, Mapping[str, Any]] | None:
        """The pin (digest, definition) this entry is held to (pinned first in ``tofu``); None: left out."""
        if mode is PinMode.LOCK:
            locked = self._locks.get(server, {}).get((kind, name))
            if locked is None:
                await self._report(DefinitionChange(server, kind, name, None, digest, mode, "refused"))
                return None
            return locked.digest, locked.definition
        cached = await self._cached(server)
        if cached is None:
            return None
        held = cached.get((kind, name))
        if held is not None:
            return held
        if self._store is None:  # no store: pinned for this process only
            cached[(kind, name)] = (digest, form)
            return cached[(kind, name)]
        try:
            pin = await self._store.pin_first(server, kind, name, digest, form, now=self._clock())
        except StoreError as exc:
            logger.warning(
                "upstream %s: %s %r left out, pinning it failed: %s", server, kind.value, name, exc
            )
            return None
        cached[(kind, name)] = (pin.digest, MappingProxyType(pin.definition))
        return cached[(kind, name)]

    async def _cached(self, server: str) -> dict[tuple[PinKind, str], tuple[str, Mapping[str, Any]]] | None:
        cached = self._cache.get(server)
        if cached is not None:
            return cached
        if self._store is None:
            return self._cache.setdefault(server, {})
        try:
            pins = await self._store.list_pins(server=server)
        except StoreError as exc:
            logger.warning(
                "upstream %s: its pins could not be read, unpinned definitions left out: %s", server, exc
            )
            return None
        loaded: dict[tuple[PinKind, str], tuple[str, Mapping[str, Any]]] = {
            (p.kind, p.name): (p.digest, MappingProxyType(p.definition)) for p in pins
        }
        return self._cache.setdefault(server, loaded)

    @staticmethod
    def _withheld(entry: ToolEntry, pinned: Mapping[str, Any], offered_digest: str) -> ToolEntry:
        return ToolEntry(
            exposed_name=entry.exposed_name,
            server=entry.server,
            namespace=entry.namespace,
            upstream_name=entry.upstream_name,
            definition=MappingProxyType({**pinned, "name": entry.exposed_name}),
            withheld=offered_digest,
        )

    async def _changed(
        self,
        server: str,
        kind: PinKind,
        name: str,
        pinned_digest: str,
        digest: str,
        form: dict[str, Any],
        mode: PinMode,
        withheld: ToolEntry | None,
    ) -> None:
        if mode is PinMode.TOFU and self._store is not None:
            try:
                _, new = await self._store.offer_pin(server, kind, name, digest, form, now=self._clock())
            except StoreError as exc:  # still withheld or hidden; the offer is retried at the next listing
                logger.warning(
                    "upstream %s: recording a changed %s %r failed: %s", server, kind.value, name, exc
                )
                return
            if not new:  # offered before (here or at a replica): reported by whoever recorded it
                return
        action = "withheld" if withheld is not None else "hidden"
        await self._report(DefinitionChange(server, kind, name, pinned_digest, digest, mode, action))

    async def _report(self, change: DefinitionChange) -> None:
        key = (change.server, change.kind, change.name, change.offered_digest)
        if key in self._reported:
            return
        self._reported.add(key)
        # Prefixed: "name" and friends are LogRecord attributes, never to be overwritten.
        logger.warning(
            "upstream definition differs from its pin",
            extra={f"pin_{k}": v for k, v in change.describe().items()},
        )
        if self._on_change is not None:
            try:
                await self._on_change(change)
            except Exception:  # the audit's own failure is its health's; admission stays closed
                logger.exception("reporting a changed definition failed")


def _file_seen(path: Path) -> tuple[str, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return str(path), stat.st_mtime_ns, stat.st_size
