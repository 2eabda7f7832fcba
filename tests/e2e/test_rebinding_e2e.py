"""DNS rebinding at the front door on a real loopback socket (issue 8 point 6)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import RunningGateway
from tests.e2e.issue4_support import entries_with_event
from tests.e2e.test_transport_rules import INIT, assert_error, headers

pytestmark = pytest.mark.anyio


def _port(running_gateway: RunningGateway) -> int:
    port = urlsplit(running_gateway.url).port
    assert port is not None
    return port


async def test_a_rebinding_host_is_refused_and_audited(running_gateway: RunningGateway) -> None:
    """A foreign Host gets 421 and opens nothing; sent with a valid credential, the refusal is audited."""
    port = _port(running_gateway)
    async with running_gateway.raw() as http:
        anonymous = await http.post(
            running_gateway.url,
            headers={**headers(), "host": f"attacker.example:{port}", "authorization": ""},
            json=INIT,
        )
        credentialed = await http.post(
            running_gateway.url, headers={**headers(), "host": f"attacker.example:{port}"}, json=INIT
        )
        other_port = await http.post(
            running_gateway.url, headers={**headers(), "host": "localhost:1"}, json=INIT
        )
    assert_error(anonymous, 421, -32600, "host_forbidden")
    assert_error(credentialed, 421, -32600, "host_forbidden")
    assert_error(other_port, 421, -32600, "host_forbidden")
    assert len(running_gateway.gateway.registry) == 0
    refused = entries_with_event(running_gateway.tmp_path / "data" / "bastion.db", "isolation_refused")
    assert [(e["agent"], e["reason"]) for e in refused] == [
        ("alice", "host_forbidden"),
        ("alice", "host_forbidden"),
    ]


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1", "[::1]"])
async def test_loopback_host_and_origin_pass_by_default(running_gateway: RunningGateway, name: str) -> None:
    """On a loopback bind, the loopback names with the bound port pass as Host and as browser Origin."""
    port = _port(running_gateway)
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url,
            headers={**headers(), "host": f"{name}:{port}", "origin": f"http://{name}:{port}"},
            json=INIT,
        )
    assert response.status_code == 200, response.text
    assert "mcp-session-id" in response.headers


async def test_a_foreign_origin_is_still_refused(running_gateway: RunningGateway) -> None:
    """A loopback Host does not make a foreign browser Origin acceptable."""
    port = _port(running_gateway)
    async with running_gateway.raw() as http:
        response = await http.post(
            running_gateway.url,
            headers={**headers(), "host": f"localhost:{port}", "origin": f"http://attacker.example:{port}"},
            json=INIT,
        )
    assert_error(response, 403, -32600, "origin_forbidden")
