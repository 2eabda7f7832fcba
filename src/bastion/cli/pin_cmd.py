"""``bastion pin``: write the pin lock file from the live upstreams (issue 27).

Loads the configuration (``--config``), starts every server with
``pinning = "lock"`` (or only those named by ``--server``) as the gateway
would, lists their tools and prompts, and writes each server's definitions,
with their digests, to its ``pin_lock_file`` (servers sharing a file share
it; a server not written keeps its entries there). The file is then reviewed
like code: ``git diff`` shows every changed description and schema. The
gateway exposes only what the file holds. Prints one line per server written.
Exit status: 0 written, 1 an upstream did not list, 2 unusable configuration.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

import anyio

from bastion.errors import ConfigError
from bastion.pinning.digest import DefinitionUnpinnable, definition_digest, pinned_form
from bastion.pinning.lockfile import LockedPin, LockedServer, read_lock_file, write_lock_file
from bastion.pinning.modes import PinMode
from bastion.policy.snapshot import Snapshot
from bastion.store.pins import PinKind

__all__ = ["add_pin_parser", "run_pin"]


def add_pin_parser(subparsers: Any) -> None:
    """Register ``pin`` on the ``bastion`` subparsers."""
    parser = subparsers.add_parser(
        "pin", help="write the pin lock file of lock-mode servers from the live upstreams"
    )
    parser.add_argument("--config", type=Path, required=True, help="the gateway's configuration file")
    parser.add_argument("--server", action="append", default=[], help="only this server (repeatable)")


def run_pin(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    from bastion.policy.load import load_snapshot

    try:
        snapshot = load_snapshot(args.config)
        chosen = _chosen(snapshot, list(args.server))
    except ConfigError as exc:
        print(f"bastion: {exc.message}", file=err)
        return 2
    try:
        listed = anyio.run(_list, snapshot, chosen)
    except ConfigError as exc:
        print(f"bastion: {exc.message}", file=err)
        return 2
    missing = [name for name in chosen if name not in listed]
    if missing:
        print(f"bastion: not written: {', '.join(missing)} did not list (is it running?)", file=err)
        return 1
    by_file: dict[str, list[str]] = defaultdict(list)
    for name in chosen:
        by_file[str(snapshot.servers[name].pin_lock_file)].append(name)
    for file_name, names in by_file.items():
        path = Path(file_name)
        try:
            held = read_lock_file(path) if path.exists() else {}
        except ConfigError:
            held = {}  # rewritten whole: the review diff shows what it held
        held.update({name: listed[name] for name in names})
        write_lock_file(path, held)
        for name in names:
            print(f"pinned {name}: {len(listed[name])} definitions to {path}", file=out)
    return 0


def _chosen(snapshot: Snapshot, named: list[str]) -> list[str]:
    lock = [name for name, spec in snapshot.servers.items() if spec.pinning is PinMode.LOCK]
    for name in named:
        if name not in lock:
            raise ConfigError(f'--server {name}: not a server with pinning = "lock"')
    chosen = named or lock
    if not chosen:
        raise ConfigError('no server has pinning = "lock": nothing to write')
    return chosen


async def _list(snapshot: Snapshot, chosen: list[str]) -> dict[str, LockedServer]:
    """Each chosen server's definitions as the gateway lists them, unpinned."""
    from bastion.upstream.fleet import UpstreamFleet

    fleet = UpstreamFleet(snapshot)  # every server, as the gateway starts them; no pins applied
    listed: dict[str, LockedServer] = {}
    async with anyio.create_task_group() as tg:
        try:
            await fleet.start(tg)
            for name in chosen:
                if not fleet.upstreams[name].health().connected:
                    continue
                locked: LockedServer = {}
                prompts = [e for e in fleet.prompt_catalog.values() if e.server == name]
                for kind, entries in ((PinKind.TOOL, fleet.tools_of(name)), (PinKind.PROMPT, prompts)):
                    for entry in entries:
                        form = pinned_form(kind, entry.definition, entry.upstream_name)
                        try:
                            locked[(kind, entry.upstream_name)] = LockedPin(definition_digest(form), form)
                        except DefinitionUnpinnable:
                            continue
                listed[name] = locked
        finally:
            await fleet.aclose()
            tg.cancel_scope.cancel()
    return listed
