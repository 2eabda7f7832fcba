"""One upstream and one ``bastion serve`` in front of it, for the benchmarks that need just that pair.

``idle_sessions.py`` and ``soak.py`` use it; ``run.py`` starts its own, more
varied set. Both processes are stopped (their whole process groups) on the
way out, whatever happened.
"""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loadgen import Target
from procs import Child
from run import start_bastion, start_upstream, write_config

__all__ = ["Stack", "running_stack"]


@dataclass(frozen=True)
class Stack:
    """The started pair: the upstream, the gateway, and the gateway's target for the load generator."""

    upstream: Child
    bastion: Child
    target: Target


@contextmanager
def running_stack(
    temp: Path,
    *,
    bastion_cmd: str | None,
    execution_ids: bool,
    start_timeout_s: float = 30.0,
) -> Iterator[Stack]:
    """Start the example upstream and ``bastion serve`` (``bastion_cmd`` or the venv's) in ``temp``."""
    args = argparse.Namespace(
        bastion_cmd=bastion_cmd,
        bastion_arg=[],
        execution_ids=execution_ids,
        start_timeout=start_timeout_s,
    )
    children: list[Child] = []
    try:
        upstream, upstream_url = start_upstream(temp, start_timeout_s)
        children.append(upstream)
        token = secrets.token_urlsafe(32)
        config = temp / "bastion.toml"
        write_config(config, upstream_url, token, None)
        bastion, target = start_bastion(args, temp, config, token, "through", "bastion", "data")
        children.append(bastion)
        yield Stack(upstream, bastion, target)
    finally:
        for child in reversed(children):
            child.stop()
