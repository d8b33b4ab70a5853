"""Secret files as rlm requires them (docs/security.md §6): the owner's alone, mode 0600. Tests and
benches write token, key, users and TLS key files with :func:`write_secret`."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_secret"]


def write_secret(path: Path, content: bytes | str) -> Path:
    """Write ``content`` (text as UTF-8) to ``path`` with mode 0600, whatever the umask; ``path``."""
    data = content.encode() if isinstance(content, str) else content
    path.write_bytes(data)
    path.chmod(0o600)
    return path
