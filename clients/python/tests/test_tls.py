"""TLS and mutual TLS against a real ``leasehold serve --tls-cert/--tls-key
[--client-ca]``, with certificates made by ``openssl`` for each test: the
right client gets in, plaintext or an untrusted server or a missing client
certificate is Unavailable, and a bearer token works over TLS."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from conftest import Server

import leasehold


@dataclass(frozen=True)
class Certs:
    """PEM files: a CA, a server certificate for 127.0.0.1 and localhost, a
    client certificate (CN ``worker-1``) from the same CA, and a second CA
    that signed nothing here."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(dir: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-days", "2", "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=dir,
    )  # fmt: skip


def _issue(dir: Path, ca: str, name: str, extensions: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr",
        cwd=dir,
    )  # fmt: skip
    (dir / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
        cwd=dir,
    )  # fmt: skip


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    dir = tmp_path / "pki"
    dir.mkdir()
    _ca(dir, "ca")
    _ca(dir, "other-ca")
    _issue(
        dir,
        "ca",
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    _issue(dir, "ca", "worker-1", "extendedKeyUsage=clientAuth\n")
    return Certs(
        ca=dir / "ca.pem",
        server_cert=dir / "server.pem",
        server_key=dir / "server.key",
        client_cert=dir / "worker-1.pem",
        client_key=dir / "worker-1.key",
        other_ca=dir / "other-ca.pem",
    )


def _serve(tmp_path: Path, certs: Certs, *extra: str) -> Server:
    return Server(
        tmp_path / "l.db",
        extra=("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key), *extra),
    )


@pytest.fixture
def tls_server(tmp_path: Path, certs: Certs) -> Iterator[Server]:
    server = _serve(tmp_path, certs)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mtls_server(tmp_path: Path, certs: Certs) -> Iterator[Server]:
    server = _serve(tmp_path, certs, "--client-ca", str(certs.ca))
    try:
        yield server
    finally:
        server.stop()


def _holds(client: leasehold.Client, key: str) -> None:
    with client.acquire(key, ttl=5.0) as lease:
        assert lease.gate() == lease.fence


def test_https_with_the_ca_path_gets_in(tls_server: Server, certs: Certs) -> None:
    """``https://`` plus ``tls_ca`` (a path) is TLS that trusts the private CA."""
    with leasehold.Client(f"https://{tls_server.address}", tls_ca=certs.ca) as client:
        _holds(client, "session:tls")


def test_tls_options_as_bytes_mean_tls_without_a_scheme(tls_server: Server, certs: Certs) -> None:
    """A bare ``host:port`` with ``tls_ca`` given as PEM bytes is TLS too."""
    with leasehold.Client(tls_server.address, tls_ca=certs.ca.read_bytes()) as client:
        _holds(client, "session:bytes")


def test_plaintext_to_a_tls_server_is_unavailable(tls_server: Server) -> None:
    """A plaintext client cannot talk to a TLS server: Unavailable."""
    with leasehold.Client(tls_server.address, timeout=2.0) as client:
        with pytest.raises(leasehold.Unavailable):
            client.check("session:plain", 1)


def test_a_client_without_the_ca_is_unavailable(tls_server: Server, certs: Certs) -> None:
    """Without the private CA (system roots, or another CA), the server's
    certificate is not trusted: Unavailable."""
    for ca in (None, certs.other_ca):
        with leasehold.Client(f"https://{tls_server.address}", tls_ca=ca, timeout=2.0) as client:
            with pytest.raises(leasehold.Unavailable):
                client.check("session:untrusted", 1)


def test_mutual_tls_without_a_client_certificate_is_unavailable(
    mtls_server: Server, certs: Certs
) -> None:
    """A server run with ``--client-ca`` refuses a client with no certificate."""
    with leasehold.Client(f"https://{mtls_server.address}", tls_ca=certs.ca, timeout=2.0) as client:
        with pytest.raises(leasehold.Unavailable):
            client.check("session:anonymous", 1)


def test_mutual_tls_with_a_client_certificate_gets_in(mtls_server: Server, certs: Certs) -> None:
    """The client certificate and key from the client CA are let in."""
    with leasehold.Client(
        f"https://{mtls_server.address}",
        tls_ca=certs.ca,
        tls_cert=certs.client_cert,
        tls_key=certs.client_key,
    ) as client:
        _holds(client, "session:mtls")


async def test_the_async_client_speaks_mutual_tls(mtls_server: Server, certs: Certs) -> None:
    """``AsyncClient`` takes the same options."""
    client = leasehold.AsyncClient(
        f"https://{mtls_server.address}",
        tls_ca=certs.ca.read_bytes(),
        tls_cert=certs.client_cert.read_bytes(),
        tls_key=certs.client_key.read_bytes(),
    )
    async with client.acquire("session:async-mtls", ttl=5.0) as lease:
        assert await lease.gate() == lease.fence
    await client.close()
    anonymous = leasehold.AsyncClient(
        f"https://{mtls_server.address}", tls_ca=certs.ca, timeout=2.0
    )
    with pytest.raises(leasehold.Unavailable):
        await anonymous.check("session:async-anonymous", 1)
    await anonymous.close()


def test_a_token_over_tls(tmp_path: Path, certs: Certs) -> None:
    """A bearer token travels over TLS and is checked as on plaintext."""
    auth = tmp_path / "auth.toml"
    digest = hashlib.sha256(b"fleet-token").hexdigest()
    auth.write_text(
        f"""
[[principal]]
name = "fleet"
token_sha256 = "{digest}"
scopes = [{{ prefix = "session:", rights = ["hold", "check", "read"] }}]
"""
    )
    server = _serve(tmp_path, certs, "--auth", str(auth))
    try:
        target = f"https://{server.address}"
        with leasehold.Client(target, tls_ca=certs.ca, token="fleet-token") as client:
            _holds(client, "session:token")
        with leasehold.Client(target, tls_ca=certs.ca) as anonymous:
            with pytest.raises(leasehold.Unauthenticated):
                anonymous.acquire("session:token", ttl=5.0)
    finally:
        server.stop()


def test_contradictory_options_are_refused_at_construction(certs: Certs) -> None:
    """Mistakes are ValueError (or OSError for a missing file) when the
    client is made, not a confusing failure at the first call."""
    with pytest.raises(ValueError, match="https://"):
        leasehold.Client("http://127.0.0.1:1", tls_ca=certs.ca)
    with pytest.raises(ValueError, match="tls_key"):
        leasehold.Client("https://127.0.0.1:1", tls_cert=certs.client_cert)
    with pytest.raises(ValueError, match="not both"):
        leasehold.Client(
            "https://127.0.0.1:1",
            tls_ca=certs.ca,
            credentials=grpc.ssl_channel_credentials(root_certificates=certs.ca.read_bytes()),
        )
    with pytest.raises(OSError, match="tls_ca"):
        leasehold.Client("https://127.0.0.1:1", tls_ca=certs.ca.with_name("missing.pem"))
    with pytest.raises(ValueError, match="host:port"):
        leasehold.Client("https:///", tls_ca=certs.ca)
