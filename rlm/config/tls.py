"""TLS contexts built from configured PEM files, for every surface that serves or calls TLS: the
HTTP API (``[server] tls_cert``/``tls_key``/``tls_ca``, rlm/http) and the Kafka listener
(``[kafka] tls_cert``/``tls_key``, rlm/kafka); docs/security.md.

Built before any socket work, so a bad file is one :class:`ConfigError` naming the config key and
the path, never an ``ssl.SSLError`` traceback from a server thread. TLS 1.2 is the floor on both
sides (Python's default context settings otherwise: no compression, forward-secret suites first).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from rlm.config.secret_files import check_secret_file
from rlm.errors import ConfigError

__all__ = ["client_context", "server_context"]

_CERT_MARK = b"-----BEGIN CERTIFICATE-----"
_KEY_MARK = b"PRIVATE KEY-----"
_MAX_PEM_BYTES = 1 << 20  # a certificate chain or key; anything larger is not one


def _read_pem(key: str, path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_PEM_BYTES)
    except OSError as err:
        raise ConfigError(f"config key {key} = '{path}': cannot be read: {err.strerror or err}") from None


def server_context(cert: Path, key: Path, *, section: str = "server") -> ssl.SSLContext:
    """A server context holding ``cert`` (PEM chain, leaf first) and its unencrypted PEM ``key``;
    ``section`` names the config table in errors (``server``, ``kafka``).

    Errors name the key at fault: unreadable, not PEM, an encrypted key (no passphrase prompt in a
    daemon), or a key that does not belong to the certificate (both named).
    """
    cert_key, key_key = f"{section}.tls_cert", f"{section}.tls_key"
    check_secret_file(key_key, key)
    cert_pem, key_pem = _read_pem(cert_key, cert), _read_pem(key_key, key)
    if _CERT_MARK not in cert_pem:
        raise ConfigError(
            f"config key {cert_key} = '{cert}': not a PEM certificate (no BEGIN CERTIFICATE block)"
        )
    if _KEY_MARK not in key_pem:
        raise ConfigError(
            f"config key {key_key} = '{key}': not a PEM private key (no BEGIN PRIVATE KEY block)"
        )
    if b"ENCRYPTED" in key_pem:
        raise ConfigError(
            f"config key {key_key} = '{key}': the private key is encrypted; rlm "
            "needs it unencrypted (protect the file with permissions, docs/security.md)"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2

    def no_passphrase() -> bytes:  # never prompt on a terminal: the markers above ruled it out
        raise ConfigError(f"config key {key_key} = '{key}': the private key needs a passphrase")

    try:
        ctx.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as err:
        raise ConfigError(
            f"config keys {cert_key} = '{cert}' and {key_key} = '{key}': "
            f"not a usable certificate and matching private key "
            f"({err.reason or err.strerror})"
        ) from None
    except OSError as err:  # replaced between the read above and this one
        raise ConfigError(
            f"config key {cert_key} = '{cert}': cannot be read: {err.strerror or err}"
        ) from None
    return ctx


def client_context(ca: Path | None, *, key: str = "server.tls_ca") -> ssl.SSLContext:
    """A client context verifying the server's certificate and host name against ``ca`` (a PEM
    bundle; ``key`` names it in errors), or the system's CAs when None."""
    ctx = ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is None:
        return ctx
    pem = _read_pem(key, ca)
    if _CERT_MARK not in pem:
        raise ConfigError(f"config key {key} = '{ca}': not a PEM certificate bundle")
    try:
        ctx.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
    except ssl.SSLError as err:
        raise ConfigError(f"config key {key} = '{ca}': not a usable CA bundle ({err.reason})") from None
    return ctx
