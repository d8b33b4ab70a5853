"""SASL/PLAIN for the Kafka listener (RFC 4616; docs/kafka-listener.md "Authentication").

Credentials come from ``kafka.sasl_plain_users_file``: one ``user:password`` per line (the first
``:`` splits; blank lines and lines starting with ``#`` are skipped), read again when the file
changes, so a password can be rotated without a restart. A PLAIN token is
``[authzid] NUL authcid NUL passwd`` (UTF-8); the authorization id, when given, must equal the user.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import Any

from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from rlm.config.secret_files import check_secret_file
from rlm.errors import ConfigError
from rlm.fsutil import FileMemo
from rlm.kafka.protocol import Codes
from rlm.kafka.steps import Conn

__all__ = ["PlainUsers", "authenticate", "handshake", "parse_users"]

log = logging.getLogger(__name__)


def parse_users(path: Path) -> dict[str, bytes]:
    """``{user: password (UTF-8)}``; a malformed line is a :class:`ConfigError` naming the file and line."""
    check_secret_file("kafka.sasl_plain_users_file", path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"kafka.sasl_plain_users_file {path} cannot be read: {err}") from None
    users: dict[str, bytes] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user:
            raise ConfigError(f'kafka.sasl_plain_users_file {path}: line {number} is not "user:password"')
        users[user] = password.encode()
    if not users:
        raise ConfigError(f"kafka.sasl_plain_users_file {path} lists no user")
    return users


class PlainUsers:
    """The users of one file, checked in constant time per comparison."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._memo = FileMemo(parse_users)
        self._memo.get(path)  # fail at startup, not at the first client

    def authenticate(self, token: bytes) -> str | None:
        """The user a PLAIN token authenticates, else None (never says which part was wrong)."""
        parts = token.split(b"\x00")
        if len(parts) != 3:
            return None
        authzid, user_b, given = parts
        try:
            user = user_b.decode()
        except UnicodeDecodeError:
            return None
        if authzid and authzid != user_b:
            return None
        users = self._memo.get(self.path)
        # Compare against a dummy when the user is unknown: same work either way.
        expected = users.get(user, b"\x00" * max(1, len(given)))
        ok = hmac.compare_digest(expected, given)
        return user if ok and user in users else None


def handshake(users: PlainUsers | None, conn: Conn, body: Any, version: int) -> Any:
    """SaslHandshake: PLAIN only, and only on a listener with users; v0 means the next frame is
    the bare token (no SaslAuthenticate)."""
    if users is None:
        return SaslHandshakeResponse(error_code=Codes.ILLEGAL_SASL_STATE, mechanisms=[])
    if body.mechanism != "PLAIN":
        return SaslHandshakeResponse(error_code=Codes.UNSUPPORTED_SASL_MECHANISM, mechanisms=["PLAIN"])
    conn.handshake = True
    conn.raw_token_next = version == 0
    return SaslHandshakeResponse(error_code=Codes.NONE, mechanisms=["PLAIN"])


def authenticate(users: PlainUsers | None, conn: Conn, body: Any) -> Any:
    """SaslAuthenticate after a PLAIN handshake; a failure is answered, then the connection closed."""

    def answer(code: int, message: str | None) -> Any:
        return SaslAuthenticateResponse(
            error_code=code, error_message=message, auth_bytes=b"", session_lifetime_ms=0
        )

    if users is None or not conn.handshake or conn.authenticated:
        conn.close_after = True
        return answer(Codes.ILLEGAL_SASL_STATE, "SaslAuthenticate without a PLAIN handshake")
    user = users.authenticate(bytes(body.auth_bytes))
    if user is None:
        conn.close_after = conn.auth_failed = True  # as Kafka: answered, then the connection closed
        log.info("kafka: %s: SASL/PLAIN authentication failed", conn.peer)
        return answer(Codes.SASL_AUTHENTICATION_FAILED, "Authentication failed: invalid username or password")
    conn.authenticated, conn.user = True, user
    return answer(Codes.NONE, None)
