"""Another agent's session id and an unknown one cost the same work (issue #12 point 9).

Timing told them apart when only the foreign id was audited. Now every
``SessionNotFound`` writes one ``isolation_refused`` entry naming its cause,
so both paths run the same code; asserted by the entries, never by timing.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import RunningGateway
from tests.e2e.issue4_support import entries_with_event
from tests.e2e.test_transport_rules import open_session, rpc, session_headers

pytestmark = pytest.mark.anyio


async def test_unknown_and_foreign_session_ids_are_audited_alike(running_gateway: RunningGateway) -> None:
    """One isolation_refused entry each, for the unknown id and for Bob's id presented by Alice."""
    async with running_gateway.raw() as http:
        bobs = await open_session(http, running_gateway.url, agent="bob")
        for session_id in ("x" * 32, bobs):
            response = await http.post(
                running_gateway.url, headers=session_headers(session_id), json=rpc("tools/list")
            )
            assert response.status_code == 404
    entries = entries_with_event(running_gateway.tmp_path / "data" / "bastion.db", "isolation_refused")
    causes = sorted(e["detail"]["cause"] for e in entries if e["agent"] == "alice")
    assert causes == ["foreign_session_id", "unknown_session_id"]
