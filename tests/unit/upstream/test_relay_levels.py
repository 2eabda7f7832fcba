"""The relay delivers log messages at and above the client's level only (upstream/relay.py)."""

from __future__ import annotations

from typing import Any

import pytest

from bastion.upstream.relay import RequestRelay

pytestmark = pytest.mark.anyio


class _Collect:
    def __init__(self) -> None:
        self.levels: list[str] = []

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        self.levels.append(params["level"])

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("not asked")


@pytest.mark.parametrize(
    ("level", "heard"),
    [
        (None, ["debug", "info", "warning", "error"]),
        ("info", ["info", "warning", "error"]),
        ("error", ["error"]),
    ],
)
async def test_log_messages_below_the_clients_level_are_not_relayed(
    level: str | None, heard: list[str]
) -> None:
    """Whatever the upstream sends, the client hears its level and above (everything when it set none)."""
    client = _Collect()
    relay = RequestRelay(client, None, log_level=level)
    for sent in ("debug", "info", "warning", "error"):
        await relay.on_notification("notifications/message", {"level": sent, "data": sent})
    assert client.levels == heard
