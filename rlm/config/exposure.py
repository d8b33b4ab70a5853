"""Exposure rules and secret-file modes, enforced when rlm starts (docs/security.md §6).

* **Exposure** (:func:`check_exposure`, run by ``rlm run`` before it listens): the HTTP API or the
  Kafka listener bound beyond loopback must have TLS *and* authentication (the API's token, the
  listener's SASL/PLAIN users), and SASL/PLAIN is only accepted over TLS — its passwords cross the
  wire as they are. A configuration that breaks a rule is refused with one line naming the key,
  unless ``[server] allow_insecure_exposure = true``, which logs the same line as a WARNING at
  every start.
* **Secret files** (:func:`~rlm.config.secret_files.check_secret_file`, re-exported here; called by
  every reader of one) live in the leaf :mod:`rlm.config.secret_files`: the settings' own readers
  (``[server]``, ``[remote.encryption]``) run while :mod:`rlm.config` is built, and this module
  needs the whole :class:`~rlm.config.Settings`, so they must not import it.
"""

from __future__ import annotations

import ipaddress
import logging

from rlm.config import Settings
from rlm.config.secret_files import check_secret_file
from rlm.errors import ConfigError

__all__ = ["check_exposure", "check_secret_file", "is_loopback"]  # check_secret_file: re-exported

log = logging.getLogger(__name__)


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
