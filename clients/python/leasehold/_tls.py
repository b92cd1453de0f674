"""Where a client connects and how: the target's scheme and the TLS options
turned into a gRPC address and channel credentials, once, for both twins.

``https://host:port`` (or any ``tls_*`` option) means TLS; ``http://`` and a
bare ``host:port`` mean plaintext; other gRPC target names (``dns:///``,
``unix:``) are passed on unchanged. Certificates are PEM, given as a path or
as the bytes themselves; files are read when the client is made, so a
missing or unreadable file is an error there and not at the first call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

#: A PEM input: the path of a file, or its contents.
Pem = str | os.PathLike[str] | bytes


@dataclass(frozen=True)
class Endpoint:
    """A resolved target: the address gRPC dials, and its credentials
    (``None`` is plaintext)."""

    address: str
    credentials: grpc.ChannelCredentials | None


def resolve(
    target: str,
    *,
    credentials: grpc.ChannelCredentials | None,
    tls_ca: Pem | None,
    tls_cert: Pem | None,
    tls_key: Pem | None,
) -> Endpoint:
    """Reads ``target``'s scheme and the TLS options.

    Raises ``ValueError`` for contradictions (``http://`` with TLS options,
    ``credentials`` with ``tls_*``, a certificate without its key) and
    ``OSError`` for a PEM file that cannot be read.
    """
    scheme, sep, rest = target.partition("://")
    scheme = scheme.lower() if sep else ""
    if scheme in ("http", "https"):
        address = rest.rstrip("/")
        if not address or "/" in address:
            raise ValueError(f"target {target!r}: expected {scheme}://host:port")
    else:
        # host:port, or a gRPC target name (dns:///..., unix:...) passed on as is.
        scheme, address = "", target
    tls_options = tls_ca is not None or tls_cert is not None or tls_key is not None
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together: a client certificate needs its key")
    if credentials is not None and tls_options:
        raise ValueError("give either credentials or tls_ca/tls_cert/tls_key, not both")
    if scheme == "http" and (credentials is not None or tls_options):
        raise ValueError(
            f"target {target!r} is plaintext (http://) but TLS options were given; use https://"
        )
    if credentials is not None:
        return Endpoint(address, credentials)
    if scheme == "https" or tls_options:
        # No CA: gRPC's default roots (the system's, or GRPC_DEFAULT_SSL_ROOTS_FILE_PATH).
        return Endpoint(
            address,
            grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca, "tls_ca"),
                private_key=_read(tls_key, "tls_key"),
                certificate_chain=_read(tls_cert, "tls_cert"),
            ),
        )
    return Endpoint(address, None)


def _read(pem: Pem | None, name: str) -> bytes | None:
    if pem is None or isinstance(pem, bytes):
        return pem
    try:
        with open(pem, "rb") as file:
            return file.read()
    except OSError as err:
        raise OSError(err.errno, f"{name}: cannot read {os.fspath(pem)!r}: {err.strerror}") from err
