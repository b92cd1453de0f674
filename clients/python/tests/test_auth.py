"""Bearer tokens against a server run with ``--auth``: a known token is let
in within its scopes, a missing one is Unauthenticated, a scope it lacks is
PermissionDenied; sync and async."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Server

import leasehold


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Server]:
    auth = tmp_path / "auth.toml"
    auth.write_text(
        f"""
[[principal]]
name = "fleet"
token_sha256 = "{_sha256("fleet-token")}"
bind_owner = true
scopes = [{{ prefix = "session:", rights = ["hold", "check"] }}]

[[principal]]
name = "dashboard"
token_sha256 = "{_sha256("dashboard-token")}"
scopes = [{{ prefix = "", rights = ["read"] }}]
"""
    )
    server = Server(tmp_path / "l.db", extra=("--auth", str(auth)))
    try:
        yield server
    finally:
        server.stop()


def test_a_token_is_let_in_within_its_scopes(guarded: Server) -> None:
    fleet = leasehold.Client(guarded.address, token="fleet-token", owner="fleet:w1")
    with fleet.acquire("session:1", ttl=5.0) as lease:
        assert lease.gate() == lease.fence
        with pytest.raises(leasehold.PermissionDenied) as denied:
            fleet.acquire("db:1", ttl=5.0)
        assert "hold" in str(denied.value) and "fleet-token" not in str(denied.value)
    with pytest.raises(leasehold.Unauthenticated):
        leasehold.Client(guarded.address, owner="fleet:w1").acquire("session:2", ttl=5.0)
    with pytest.raises(leasehold.Unauthenticated):
        leasehold.Client(guarded.address, token="guess").acquire("session:2", ttl=5.0)
    with pytest.raises(leasehold.PermissionDenied):
        leasehold.Client(guarded.address, token="dashboard-token").acquire("session:3", ttl=5.0)
    fleet.close()


async def test_the_async_client_sends_its_token_too(guarded: Server) -> None:
    fleet = leasehold.AsyncClient(guarded.address, token="fleet-token", owner="fleet:a1")
    async with fleet.acquire("session:9", ttl=5.0) as lease:
        assert await lease.gate() == lease.fence
    anonymous = leasehold.AsyncClient(guarded.address, owner="fleet:a2")
    with pytest.raises(leasehold.Unauthenticated):
        await anonymous.acquire("session:9", ttl=5.0)
    await fleet.close()
    await anonymous.close()


def test_a_principal_at_its_key_limit_gets_resource_exhausted(tmp_path: Path) -> None:
    """``--max-keys-per-principal``: the principal's next key is refused with
    the limit's name, its held key and other principals are still served."""
    auth = tmp_path / "auth.toml"
    auth.write_text(
        f"""
[[principal]]
name = "fleet"
token_sha256 = "{_sha256("fleet-token")}"
scopes = [{{ prefix = "session:", rights = ["hold", "check"] }}]

[[principal]]
name = "other"
token_sha256 = "{_sha256("other-token")}"
scopes = [{{ prefix = "session:", rights = ["hold", "check"] }}]
"""
    )
    server = Server(tmp_path / "l.db", extra=("--auth", str(auth), "--max-keys-per-principal", "1"))
    try:
        fleet = leasehold.Client(server.address, token="fleet-token")
        other = leasehold.Client(server.address, token="other-token")
        with fleet.acquire("session:1", ttl=5.0) as lease:
            with pytest.raises(leasehold.ResourceExhausted) as refused:
                fleet.acquire("session:2", ttl=5.0)
            assert refused.value.limit == "keys_per_principal"
            assert lease.gate() == lease.fence
            with other.acquire("session:2", ttl=5.0):
                pass
        # Released: the key is given back.
        with fleet.acquire("session:3", ttl=5.0):
            pass
        fleet.close()
        other.close()
    finally:
        server.stop()
