"""Exposure rules and secret-file modes, enforced when rlm starts (docs/security.md §6).

* **Exposure** (:func:`check_exposure`, run by ``rlm run`` before it listens): the HTTP API or the
  Kafka listener bound beyond loopback must have TLS *and* authentication (the API's token, the
  listener's SASL/PLAIN users), and SASL/PLAIN is only accepted over TLS — its passwords cross the
  wire as they are. A configuration that breaks a rule is refused with one line naming the key,
  unless ``[server] allow_insecure_exposure = true``, which logs the same line as a WARNING at
  every start.
* **Secret files** (:func:`check_secret_file`, called by every reader of one — the token file, the
  TLS private keys, the SASL/PLAIN users file, the master key files — so one-shot commands check
  the files they read too): a file whose mode lets group or others read or write it is refused with
  the key, the path and the mode. Where file modes mean nothing (Windows) it is a warning.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from rlm.errors import ConfigError

if TYPE_CHECKING:  # rlm.config imports this module's users; the type is only needed by mypy
    from rlm.config import Settings

__all__ = ["check_exposure", "check_secret_file", "is_loopback"]

log = logging.getLogger(__name__)

#: Permission bits of a secret file that group or others hold: any of them is refused.
_SHARED_BITS = stat.S_IRWXG | stat.S_IRWXO


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only accepts connections from this machine; a
    wildcard (``0.0.0.0``, ``::``) or any other name is beyond loopback (a name may resolve anywhere)."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _exposure_problems(settings: Settings) -> list[str]:
    s, k = settings.server, settings.kafka
    problems = []
    if not is_loopback(s.host):
        missing = [
            n
            for n, ok in (("server.tls_cert", s.tls_cert), ("server.token", s.token or s.token_file))
            if not ok
        ]
        if missing:
            problems.append(
                f"config key server.host = '{s.host}' listens beyond loopback without "
                f"{' and '.join(missing)} (TLS and a bearer token)"
            )
    host = k.listen.rpartition(":")[0]
    if k.listen and not is_loopback(host):
        missing = [
            n
            for n, ok in (
                ("kafka.tls_cert", k.tls_cert),
                ("kafka.sasl_plain_users_file", k.sasl_plain_users_file),
            )
            if not ok
        ]
        if missing:
            problems.append(
                f"config key kafka.listen = '{k.listen}' listens beyond loopback without "
                f"{' and '.join(missing)} (TLS and SASL/PLAIN)"
            )
    if k.sasl_plain_users_file is not None and k.tls_cert is None:
        problems.append(
            "config key kafka.sasl_plain_users_file is set without kafka.tls_cert: "
            "SASL/PLAIN passwords would cross the network in clear"
        )
    return problems


def check_exposure(settings: Settings) -> None:
    """Refuse (:class:`ConfigError`, one line) a surface exposed beyond loopback without TLS and
    authentication, or SASL/PLAIN without TLS; with ``server.allow_insecure_exposure`` log each
    as a WARNING instead."""
    problems = _exposure_problems(settings)
    if not problems:
        return
    if not settings.server.allow_insecure_exposure:
        raise ConfigError(
            "; ".join(problems) + " — refused: add them, or set server.allow_insecure_exposure = true "
            "to start anyway (docs/security.md §6)"
        )
    for problem in problems:
        log.warning("INSECURE EXPOSURE (server.allow_insecure_exposure = true): %s", problem)


def check_secret_file(key: str, path: Path) -> None:
    """Refuse ``path`` (named by config ``key``) when group or others have any permission on it:
    a secret must be the owner's alone (mode 0600 or 0400). A file that cannot be stat'ed is left
    to its reader, which names the error; on a platform without POSIX modes, a warning."""
    if os.name != "posix":
        log.warning("config key %s = '%s': file permissions cannot be checked on this platform", key, path)
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode) and mode & _SHARED_BITS:  # not a file: its reader says why
        raise ConfigError(
            f"config key {key} = '{path}': mode {mode:04o} lets group or others access a secret; "
            f"chmod 0600 (or 0400) it (docs/security.md §6)"
        )
