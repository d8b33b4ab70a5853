"""Secret-file modes, enforced by every reader of a secret file (docs/security.md §6).

:func:`check_secret_file` is called by each reader of one — the token file, the TLS private keys,
the SASL/PLAIN users file, the master key files, the cluster's SASL password file — so one-shot
commands check the files they read too: a file whose mode lets group or others read or write it
is refused with the key, the path and the mode. Where file modes mean nothing (Windows) it is a
warning. A leaf of :mod:`rlm.config`: the settings' readers import it while :mod:`rlm.config` is
being built, so it imports nothing of the configuration (the exposure rules, which need the whole
:class:`~rlm.config.Settings`, are :mod:`rlm.config.exposure`).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from rlm.errors import ConfigError

__all__ = ["check_secret_file"]

log = logging.getLogger("rlm.config.exposure")  # the logger these warnings had before the split

#: Permission bits of a secret file that group or others hold: any of them is refused.
_SHARED_BITS = stat.S_IRWXG | stat.S_IRWXO


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
