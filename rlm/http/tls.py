"""TLS contexts of the API (docs/security.md): the server's from ``[server] tls_cert``/``tls_key``,
a client's from ``[server] tls_ca``.

Both are built here, before any socket work, so a bad file is one :class:`ConfigError` naming the
config key and the path, never an ``ssl.SSLError`` traceback from uvicorn's thread. TLS 1.2 is the
floor on both sides (Python's default context settings otherwise: no compression, forward-secret
suites first).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from rlm.config import ServerSettings
from rlm.errors import ConfigError

_CERT_MARK = b"-----BEGIN CERTIFICATE-----"
_KEY_MARK = b"PRIVATE KEY-----"
_MAX_PEM_BYTES = 1 << 20  # a certificate chain or key; anything larger is not one


def _read_pem(key: str, path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_PEM_BYTES)
    except OSError as err:
        raise ConfigError(f"config key {key} = '{path}': cannot be read: {err.strerror or err}") from None


def serving_context(server: ServerSettings) -> ssl.SSLContext | None:
    """The API's context when ``[server] tls_cert``/``tls_key`` are set (config checks made them
    come together), else None: plain HTTP."""
    if server.tls_cert is None or server.tls_key is None:
        return None
    return server_context(server.tls_cert, server.tls_key)


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context holding ``cert`` (PEM chain, leaf first) and its unencrypted PEM ``key``.

    Errors name the key at fault: unreadable, not PEM, an encrypted key (no passphrase prompt in a
    daemon), or a key that does not belong to the certificate (both named).
    """
    cert_pem, key_pem = _read_pem("server.tls_cert", cert), _read_pem("server.tls_key", key)
    if _CERT_MARK not in cert_pem:
        raise ConfigError(f"config key server.tls_cert = '{cert}': not a PEM certificate "
                          "(no BEGIN CERTIFICATE block)")
    if _KEY_MARK not in key_pem:
        raise ConfigError(f"config key server.tls_key = '{key}': not a PEM private key "
                          "(no BEGIN PRIVATE KEY block)")
    if b"ENCRYPTED" in key_pem:
        raise ConfigError(f"config key server.tls_key = '{key}': the private key is encrypted; rlm "
                          "needs it unencrypted (protect the file with permissions, docs/security.md)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2

    def no_passphrase() -> bytes:  # never prompt on a terminal: the markers above ruled it out
        raise ConfigError(f"config key server.tls_key = '{key}': the private key needs a passphrase")

    try:
        ctx.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as err:
        raise ConfigError(f"config keys server.tls_cert = '{cert}' and server.tls_key = '{key}': "
                          f"not a usable certificate and matching private key "
                          f"({err.reason or err.strerror})") from None
    except OSError as err:  # replaced between the read above and this one
        raise ConfigError(f"config key server.tls_cert = '{cert}': cannot be read: "
                          f"{err.strerror or err}") from None
    return ctx


def client_context(ca: Path | None) -> ssl.SSLContext:
    """A client context verifying the server's certificate and host name against ``ca`` (a PEM
    bundle), or the system's CAs when None."""
    ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is None:
        return ctx
    pem = _read_pem("server.tls_ca", ca)
    if _CERT_MARK not in pem:
        raise ConfigError(f"config key server.tls_ca = '{ca}': not a PEM certificate bundle")
    try:
        ctx.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
    except ssl.SSLError as err:
        raise ConfigError(f"config key server.tls_ca = '{ca}': not a usable CA bundle "
                          f"({err.reason})") from None
    return ctx
