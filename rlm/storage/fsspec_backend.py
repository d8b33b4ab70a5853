"""A backend over any fsspec file system — the base of the ``hdfs`` plugin, usable for others.

``FsspecBackend(protocol="memory", root="/store", storage_options={...})``. Objects are files under
``root``; uploads go to ``<root>/.rlm-tmp/<random>`` and are published by a rename, so readers never
see a partial object. "Create only if absent" is ``exists`` + rename here (not atomic: capability
false); subclasses whose rename refuses to replace (HDFS) override :meth:`_publish_if_absent` and
:attr:`atomic_conditional_create`. Listing walks ``find`` under the deepest directory of the prefix
and sorts, so a page costs a walk of that subtree (fine for per-partition prefixes).

Not an entry point of its own: subclasses register (``hdfs``); build it in code otherwise.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any, BinaryIO, ClassVar

from rlm.errors import ObjectExistsError, ObjectNotFoundError, StorageError, TransientStorageError
from rlm.storage.api import (
    RESERVED_PREFIX,
    Capabilities,
    ListPage,
    ObjectInfo,
    StorageBackend,
    page_from_sorted,
)
from rlm.storage.options import Option

__all__ = ["TMP_DIR", "FsspecBackend"]

TMP_DIR = RESERVED_PREFIX + "tmp"
#: fsspec protocols whose ``root`` is a path of this host (relative = against the working directory).
_LOCAL_PROTOCOLS = ("file", "local")


class FsspecBackend(StorageBackend):
    """Objects as files of an fsspec file system; see module doc."""

    name: ClassVar[str] = "fsspec"
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("protocol", "str", required=True),
        Option("root", "str", required=True),
        Option("storage_options", "dict", default=None, secret=True),
    )
    #: True when :meth:`_publish_if_absent` is atomic against concurrent creators.
    atomic_conditional_create: ClassVar[bool] = False

    @classmethod
    def portable_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(options)
        if out.get("protocol") in _LOCAL_PROTOCOLS and isinstance(out.get("root"), str):
            out["root"] = os.path.abspath(os.path.expanduser(out["root"]))
        return out

    def __init__(self, **options: Any) -> None:
        super().__init__(**self.portable_options(options))  # a pickled copy keeps this host's path
        self._fs_cache: Any = None

    # -- file system ------------------------------------------------------------------------------

    @property
    def root(self) -> str:
        return str(self.options["root"]).rstrip("/") or "/"

    def _make_fs(self) -> Any:
        import fsspec

        return fsspec.filesystem(self.options["protocol"], **(self.options["storage_options"] or {}))

    @property
    def fs(self) -> Any:
        """The file system, created on first use (construction needs no server)."""
        if self._fs_cache is None:
            try:
                self._fs_cache = self._make_fs()
            except ImportError as e:
                raise StorageError(f"{self.name}: a library is missing: {e}") from e
            except Exception as e:
                raise self._translate("connect", self.root, e) from e
        return self._fs_cache

    def _path(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{key}"

    def _translate(self, op: str, key: str, e: BaseException) -> StorageError:
        """The one place file-system errors become rlm.errors."""
        text = f"{self.name}: {op} {key!r}: {type(e).__name__}: {e}"
        if isinstance(e, StorageError):
            return e
        if isinstance(e, FileNotFoundError):
            return ObjectNotFoundError(text)
        if isinstance(e, FileExistsError):
            return ObjectExistsError(text)
        if self._is_transient(e):
            return TransientStorageError(text)
        return StorageError(text)

    def _is_transient(self, e: BaseException) -> bool:
        """Whether ``e`` is safe to retry, by its type (never its text): the OS's timeouts and
        dropped connections here; subclasses add their transport's (``hdfs``: requests')."""
        return isinstance(e, TimeoutError | ConnectionError)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(conditional_create=self.atomic_conditional_create, multipart=False)

    # -- writes -----------------------------------------------------------------------------------

    def _publish_if_absent(self, tmp: str, final: str) -> None:
        """Move ``tmp`` to ``final`` unless ``final`` exists (then FileExistsError). Not atomic here."""
        if self.fs.exists(final):
            raise FileExistsError(final)
        self.fs.mv(tmp, final)

    def _publish(self, tmp: str, final: str) -> None:
        """Move ``tmp`` to ``final``, replacing it."""
        self.fs.mv(tmp, final)

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        final = self._path(key)
        tmp = f"{self.root.rstrip('/')}/{TMP_DIR}/{uuid.uuid4().hex}"
        try:
            fs = self.fs
            fs.makedirs(f"{self.root.rstrip('/')}/{TMP_DIR}", exist_ok=True)
            with fs.open(tmp, "wb") as f:
                shutil.copyfileobj(stream, f, 1 << 20)
            parent = final.rsplit("/", 1)[0]
            if parent:
                fs.makedirs(parent, exist_ok=True)
            if if_absent:
                self._publish_if_absent(tmp, final)
            else:
                self._publish(tmp, final)
            return self._info(key, fs.info(final))
        except BaseException as e:
            try:
                if self._fs_cache is not None and self._fs_cache.exists(tmp):
                    self._fs_cache.rm_file(tmp)
            except Exception:
                pass  # a stray temp file is garbage, never visible as an object
            if isinstance(e, Exception):
                raise self._translate("put", key, e) from e
            raise

    def _delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            return
        except Exception as e:
            raise self._translate("delete", key, e) from e

    # -- reads ------------------------------------------------------------------------------------

    def _info(self, key: str, info: dict[str, Any]) -> ObjectInfo:
        if info.get("type") != "file":
            raise ObjectNotFoundError(f"{self.name}: no object {key!r}")
        mtime = info.get("mtime") or info.get("modificationTime")
        return ObjectInfo(
            key, int(info.get("size") or 0), None, float(mtime) if isinstance(mtime, int | float) else None
        )

    def _head(self, key: str) -> ObjectInfo:
        try:
            return self._info(key, self.fs.info(self._path(key)))
        except Exception as e:
            raise self._translate("head", key, e) from e

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        size = self._head(key).size
        stop = size if end is None else min(end, size)
        if start >= stop:
            return b""
        try:
            return bytes(self.fs.cat_file(self._path(key), start=start, end=stop))
        except Exception as e:
            raise self._translate("read", key, e) from e

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self._path(base) if base else self.root
        try:
            found = self.fs.find(top, detail=True) if self.fs.exists(top) else {}
        except FileNotFoundError:
            found = {}
        except Exception as e:
            raise self._translate("list", prefix, e) from e
        infos = []
        for path, info in found.items():
            key = "/" + path.lstrip("/")
            key = key[len("/" + self.root.strip("/")) + 1 :] if self.root != "/" else key[1:]
            if (
                not key
                or key.startswith(RESERVED_PREFIX)
                or not key.startswith(prefix)
                or (start_after is not None and key <= start_after)
                or info.get("type") != "file"
            ):
                continue
            infos.append((key, info))
        infos.sort(key=lambda t: t[0])
        return page_from_sorted((self._info(k, i) for k, i in infos[: limit + 1]), limit)
