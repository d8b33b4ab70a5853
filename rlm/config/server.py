"""``[server]`` transport security: the keys that must go together, and the bearer token from
``token`` or ``token_file`` (docs/security.md).

The token file is read when the API starts (``rlm run``) or a client is built from the settings,
never at config load: commands that do not talk HTTP must not need to read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlm.config import validators as v
from rlm.config.keys import key
from rlm.config.secret_files import check_secret_file
from rlm.errors import ConfigError

__all__ = ["MAX_TOKEN_FILE_BYTES", "ServerSettings", "bearer_token", "check_server"]

#: The token file may hold at most this many bytes: a token, not a file given by mistake.
MAX_TOKEN_FILE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """``[server]``: the HTTP API. Loopback by default; a token enables Bearer auth, tls_cert HTTPS."""

    host: str = key(
        "127.0.0.1",
        v.string(non_empty=True),
        "HTTP API / status page / metrics address (loopback unless told otherwise).",
    )
    port: int = key(9464, v.integer(0, 65535), "HTTP port (0 = any free port).")
    token: str = key(
        "",
        v.string(),
        "When set, every route but `/healthz`, `/` and `/static` needs `Authorization: Bearer <token>`.",
    )
    request_timeout_ms: int = key(
        30_000,
        v.integer(1),
        "A request whose response has not started by then answers 504; a stream is cut when one "
        "chunk read or write takes longer; a connection whose request headers take longer is "
        "closed (docs/http-api.md §8).",
    )
    max_body_bytes: int = key(
        1_048_576,
        v.integer(0),
        "Request bodies above this size (declared or streamed) answer 413, on every route.",
    )
    token_file: Path | None = key(
        None,
        v.optional_file,
        "A file holding the bearer token (one line; one trailing newline is dropped), read when the "
        "API starts; exclusive with `token` (docs/security.md).",
    )
    tls_cert: Path | None = key(
        None,
        v.optional_file,
        "PEM certificate chain (leaf first): with `tls_key` the API serves HTTPS only, TLS 1.2 or "
        "newer (docs/security.md).",
    )
    tls_key: Path | None = key(
        None,
        v.optional_file,
        "The certificate's PEM private key, unencrypted (protect it with file permissions); set with "
        "`tls_cert`.",
    )
    tls_ca: Path | None = key(
        None,
        v.optional_file,
        "For clients built from this config (`RlmClient.for_server`): the PEM CA bundle that "
        "verifies `tls_cert`; unset = the system's CAs.",
    )
    max_decoded_bytes: int = key(
        64 << 20,
        v.integer(1),
        "Decoded record bytes (keys, values, header values) one `format=json` fetch may hold: the "
        "answer stops before the batch that would exceed it, a first batch alone above it answers "
        "422 (docs/http-api.md §8).",
    )
    max_connections: int = key(
        256,
        v.integer(1),
        "Open API connections (or requests in progress) above which a new request answers 503 "
        "(docs/http-api.md §8).",
    )
    serve_internal_topics: bool = key(
        False,
        v.boolean,
        "Serve Kafka's internal logs (`__consumer_offsets`, `__transaction_state`, ...) on every "
        "surface (API, Kafka listener, CLI reads, export); `__cluster_metadata` never "
        '(docs/visibility.md "Internal topics").',
    )
    allow_insecure_exposure: bool = key(
        False,
        v.boolean,
        "Start although the API or Kafka listener listens beyond loopback without TLS and "
        "authentication, or SASL/PLAIN runs without TLS (logged as a WARNING every start; "
        "docs/security.md §6).",
    )

    def __repr__(self) -> str:  # never print the token
        return f"ServerSettings(host={self.host!r}, port={self.port}, token={'***' if self.token else ''!r})"


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
    check_secret_file("server.token_file", path)
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
