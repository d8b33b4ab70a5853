"""``[server]`` transport security: the keys that must go together, and the bearer token from
``token`` or ``token_file`` (docs/security.md).

The token file is read when the API starts (``rlm run``) or a client is built from the settings,
never at config load: commands that do not talk HTTP must not need to read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlm.errors import ConfigError

if TYPE_CHECKING:  # rlm.config imports this module; the type is only needed by mypy
    from rlm.config import ServerSettings

__all__ = ["MAX_TOKEN_FILE_BYTES", "bearer_token", "check_server"]

#: The token file may hold at most this many bytes: a token, not a file given by mistake.
MAX_TOKEN_FILE_BYTES = 4096


def check_server(server: ServerSettings) -> None:
    """Refuse combinations that would silently serve or connect differently than configured:
    a certificate without its key (or the reverse), two token sources, a CA without HTTPS."""
    if (server.tls_cert is None) != (server.tls_key is None):
        given, missing = ("tls_cert", "tls_key") if server.tls_cert is not None else ("tls_key", "tls_cert")
        raise ConfigError(
            f"config key server.{missing} is empty: server.{given} is set, and HTTPS "
            "needs both the certificate (tls_cert) and its private key (tls_key)"
        )
    if server.token and server.token_file is not None:
        raise ConfigError(
            "config keys server.token and server.token_file are both set: give the "
            "bearer token one way (token_file keeps it out of the config file)"
        )
    if server.tls_ca is not None and server.tls_cert is None:
        raise ConfigError(
            "config key server.tls_ca is set but server.tls_cert is not: the CA "
            "verifies the API's HTTPS certificate, and the API serves plain HTTP"
        )


def bearer_token(server: ServerSettings) -> str:
    """The token API requests must carry: ``server.token``, or the content of ``server.token_file``
    (UTF-8, one trailing newline removed, at most :data:`MAX_TOKEN_FILE_BYTES`); "" = no auth.

    An unreadable, empty, oversized or multi-line token file is a :class:`ConfigError` naming the
    key and path (never the content): an empty token would silently turn authentication off.
    """
    if server.token_file is None:
        return server.token
    path = server.token_file
    where = f"config key server.token_file = '{path}'"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{where}: cannot be read: {err.strerror or err}") from None
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_TOKEN_FILE_BYTES} bytes; it must hold only the token")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")  # one line ending, as `echo` writes it
    if not text:
        raise ConfigError(f"{where}: the file is empty (an empty token would turn authentication off)")
    # HTTP strips spaces around a header value: a token with them could never match.
    if any(c in text for c in "\r\n") or text != text.strip():
        raise ConfigError(f"{where}: the token must be one line without surrounding spaces")
    return text
