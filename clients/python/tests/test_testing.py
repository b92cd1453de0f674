"""leasehold.testing: the throwaway server users' own tests start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

import leasehold
import leasehold.testing
from leasehold.testing import leasehold_server  # noqa: F401  (the fixture, as a user imports it)


def test_the_fixture_serves_a_real_server(leasehold_server: leasehold.testing.TestServer) -> None:  # noqa: F811
    assert leasehold_server.address.startswith("127.0.0.1:")
    with leasehold.Client(leasehold_server.address) as client:
        with client.acquire("k", ttl=5.0) as lease:
            assert lease.fence >= 1
    assert leasehold_server.db.exists()


def test_the_server_is_stopped_and_its_database_removed_after_the_block() -> None:
    with leasehold.testing.server() as srv:
        db = srv.db
        with leasehold.Client(srv.address) as client:
            client.acquire("k", ttl=5.0).release()
    assert srv.process.poll() is not None
    assert not db.exists()


def test_teardown_does_not_wait_for_a_client_left_open() -> None:
    """A test that never closes its client (as the README's example) must
    not hold its teardown for the server's drain (5 s by default)."""
    with leasehold.testing.server() as srv:
        client = leasehold.Client(srv.address)
        client.acquire("k", ttl=5.0).release()  # the connection is open and idle
        started = time.monotonic()
    elapsed = time.monotonic() - started
    client.close()
    # Exited by itself on SIGTERM (0), not killed after the drain; a generous
    # bound against the 5 s drain, not a benchmark.
    assert srv.process.returncode == 0
    assert elapsed < 2.0, f"teardown took {elapsed:.1f} s"


def test_a_drain_timeout_of_ones_own_is_passed_as_given() -> None:
    with leasehold.testing.server("--drain-timeout-ms", "250") as srv:
        args = cast("list[str]", srv.process.args)  # as server() gave it to Popen
        assert args.count("--drain-timeout-ms") == 1
        assert args[args.index("--drain-timeout-ms") + 1] == "250"
        with leasehold.Client(srv.address) as client:
            client.acquire("k", ttl=5.0).release()


def test_without_a_binary_it_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("LEASEHOLD_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(leasehold.testing.NoServerBinary, match="set LEASEHOLD_BIN"):
        with leasehold.testing.server():
            pass
    monkeypatch.setenv("LEASEHOLD_BIN", str(tmp_path / "missing"))
    with pytest.raises(leasehold.testing.NoServerBinary, match="not an executable"):
        leasehold.testing.find_binary()


def test_it_finds_leasehold_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    binary = os.environ["LEASEHOLD_BIN"]
    (tmp_path / "leasehold").symlink_to(binary)
    monkeypatch.delenv("LEASEHOLD_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert leasehold.testing.find_binary() == str(tmp_path / "leasehold")


# A "server" that speaks gRPC but not leasehold.v1 (an older release would
# look the same: no ServerInfo): only the standard health service.
_FOREIGN = """
import sys
from concurrent import futures
import grpc
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(f"listening on 127.0.0.1:{port}", flush=True)
server.wait_for_termination(timeout=60)
"""


def test_a_server_older_than_the_client_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "leasehold"
    fake.write_text(f"#!{sys.executable}\n{_FOREIGN}")
    fake.chmod(0o755)
    monkeypatch.setenv("LEASEHOLD_BIN", str(fake))
    with pytest.raises(leasehold.testing.IncompatibleServer, match="older than this client") as e:
        with leasehold.testing.server():
            pass
    assert f"revision {leasehold.PROTOCOL}" in str(e.value)
    assert "leasehold health" in str(e.value)


def test_server_info_says_the_server_speaks_this_client(
    leasehold_server: leasehold.testing.TestServer,  # noqa: F811
) -> None:
    with leasehold.Client(leasehold_server.address) as client:
        info = client.server_info()
    assert info.protocol >= leasehold.PROTOCOL and info.compatible
    assert info.backend == "sqlite"
    version = subprocess.run(
        [os.environ["LEASEHOLD_BIN"], "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert info.version in version
