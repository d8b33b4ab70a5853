"""``local``: objects are files under a root directory (a mounted NFS/SMB share works too).

Options: ``root`` (required; a relative path is resolved against the current working directory when
the backend is built, and normalised — the backend's options and its pickled copies carry the
absolute path, so Spark executors in other directories use the same store: docs/spark-cluster.md),
``create`` (make ``root`` if missing, default true), ``fsync`` (default true), ``direct_io`` (default
true: objects of 1 MiB or more are written, and ranges of 1 MiB or more read, with ``O_DIRECT``,
past the page cache — :mod:`rlm.storage.direct_write` and :mod:`rlm.storage.direct_read` say why;
a file system refusing it is written to and read buffered).

Durability and atomicity: every upload is written to ``<root>/.rlm-tmp/<random>``, flushed and
fsync'ed, then published with ``os.replace`` (overwrite) or ``os.link`` (create-only-if-absent: the
link fails atomically when the key exists), after which the parent directory is fsync'ed. Readers
therefore see the whole object or none of it, and a crash leaves at most a stray temporary file
(never a visible truncated object). ``.rlm-tmp`` is hidden from listings.

Listings: a prefix that ends inside a name at the root (``topic-0=``: every topic-id root of a
partition) is found by bisecting the root's entries, listed again only when the root changed (a
:class:`~rlm.fsutil.FileMemo` of the root) or the listing is older than
:data:`ROOT_LISTING_MAX_AGE_S` (a share's client may cache a directory's attributes). A GC
over P partitions lists each partition's roots: scanning the root for each was O(P²), 80 CPU s
at 10 000 partitions (BENCHMARKS.md "Idle beside a live Kafka broker").

Limitation of a file system: a key cannot be both an object and a "directory" of other keys
(``a`` and ``a/b``); such a put raises :class:`~rlm.errors.StorageError`.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import os
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from rlm.errors import ObjectExistsError, ObjectNotFoundError, StorageError, TransientStorageError
from rlm.fsutil import FileMemo
from rlm.storage.api import (
    RESERVED_PREFIX,
    Capabilities,
    ListPage,
    ObjectInfo,
    StorageBackend,
    page_from_sorted,
    validate_key,
)
from rlm.storage.direct_read import MIN_BYTES, read_direct
from rlm.storage.direct_write import copy_to_fd
from rlm.storage.options import Option

__all__ = ["ROOT_LISTING_MAX_AGE_S", "TMP_DIR", "LocalBackend"]

TMP_DIR = RESERVED_PREFIX + "tmp"

#: How long one listing of the store's root answers root-level prefixes while the root's ``stat``
#: signature stays the same (s): on a local file system the signature alone decides; on a share
#: whose client caches directory attributes, this bounds how stale a listing can be.
ROOT_LISTING_MAX_AGE_S = 1.0


def _sorted_keys(directory: Path, dir_key: str) -> list[str]:
    """The keys of ``directory``'s entries (``dir_key`` + name, a directory's ending in ``/``) in
    key order — sorting by that string gives global key order; the reserved ones hidden at the
    root (``dir_key`` empty)."""
    with os.scandir(directory) as entries:
        return sorted(
            dir_key + e.name + ("/" if e.is_dir(follow_symlinks=False) else "")
            for e in entries
            if dir_key or not e.name.startswith(RESERVED_PREFIX)
        )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBackend(StorageBackend):
    """A directory as an object store; see module doc."""

    name: ClassVar[str] = "local"
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("root", "str", required=True, help="the directory holding the objects"),
        Option("create", "bool", default=True),
        Option("fsync", "bool", default=True),
        Option(
            "direct_io",
            "bool",
            default=True,
            help="write objects and read ranges of 1 MiB or more past the page cache",
        ),
    )

    @classmethod
    def portable_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(options)
        if isinstance(out.get("root"), str):
            # Normalised (``..`` too): the root is spelt into every RDI URL, so ``../store`` and
            # the absolute path of the same directory must give the same URLs.
            out["root"] = os.path.abspath(os.path.expanduser(out["root"]))
        return out

    def __init__(self, **options: Any) -> None:
        # Absolute in self.options too: a pickled copy (Spark executors) must not re-resolve it
        # against another working directory (docs/spark-cluster.md).
        super().__init__(**self.portable_options(options))
        self.root = Path(self.options["root"])
        self._root_keys: FileMemo[list[str]] = FileMemo(
            lambda root: _sorted_keys(root, ""), max_entries=1, max_age_s=ROOT_LISTING_MAX_AGE_S
        )
        if self.root.exists() and not self.root.is_dir():
            raise StorageError(f"local: root {str(self.root)!r} is not a directory")
        try:
            if self.options["create"]:
                self.root.mkdir(parents=True, exist_ok=True)
            (self.root / TMP_DIR).mkdir(exist_ok=True)
        except OSError as e:
            raise StorageError(f"local: cannot use root {str(self.root)!r}: {e.strerror or e}") from e

    def url(self, key: str) -> str:
        return (self.root / validate_key(key)).as_uri()

    def key_for_url(self, url: str) -> str:
        # as_uri() percent-encodes characters outside RFC 3986's unreserved set, such as the "=" of
        # a topic-id root (docs/topic-identity.md): decode the key part so this stays url()'s inverse.
        root = self.url("x")[:-1]
        if not url.startswith(root):
            raise ValueError(f"{url!r} is not an object URL of this {self.name} store ({root}...)")
        return validate_key(urllib.parse.unquote(url[len(root) :]))

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(conditional_create=True, multipart=False, local_io=True)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _oserror(self, op: str, key: str, e: OSError) -> StorageError:
        """By type: a timed-out file system (NFS, a FUSE mount) may answer again, so it is
        transient (retried by the layer above, docs/storage.md); anything else is not."""
        text = f"local: {op} {key!r} failed: {e.strerror or e}"
        return TransientStorageError(text) if isinstance(e, TimeoutError) else StorageError(text)

    # -- writes ---------------------------------------------------------------------------------

    def _makedirs(self, directory: Path) -> None:
        """Create ``directory`` and missing parents, fsync'ing each parent that gained an entry."""
        missing: list[Path] = []
        d = directory
        while not d.is_dir():
            missing.append(d)
            d = d.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                d.mkdir()
            if self.options["fsync"]:
                _fsync_dir(d.parent)

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        final = self._path(key)
        tmp = self.root / TMP_DIR / uuid.uuid4().hex
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                copy_to_fd(stream, fd, direct=self.options["direct_io"])
                if self.options["fsync"]:
                    os.fsync(fd)
            finally:
                os.close(fd)
            for _attempt in range(10):  # a concurrent delete may prune the parent dir meanwhile
                self._makedirs(final.parent)
                try:
                    if if_absent:
                        os.link(tmp, final)
                    else:
                        os.replace(tmp, final)
                    break
                except FileNotFoundError:
                    continue
            else:
                raise StorageError(f"local: could not publish {key!r}: parent directory keeps vanishing")
            if self.options["fsync"]:
                _fsync_dir(final.parent)
            st = final.stat()
        except FileExistsError:
            raise ObjectExistsError(f"local: object {key!r} already exists") from None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.EISDIR):
                raise StorageError(f"local: key {key!r} conflicts with an existing object or prefix") from e
            raise self._oserror("put", key, e) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return ObjectInfo(key, st.st_size, None, st.st_mtime)

    def _delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return  # a "directory" is not an object: nothing to delete
        except OSError as e:
            raise self._oserror("delete", key, e) from e
        # Prune now-empty parent directories (best effort; a concurrent put retries).
        d = path.parent
        while d != self.root:
            try:
                d.rmdir()
            except OSError:
                break
            d = d.parent

    # -- reads ----------------------------------------------------------------------------------

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        try:
            if self.options["direct_io"] and end is not None and end - start >= MIN_BYTES:
                data = read_direct(self._path(key), start, end)
                if data is not None:
                    return data
            with open(self._path(key), "rb") as f:
                if end is None:
                    f.seek(start)
                    return f.read()
                size = os.fstat(f.fileno()).st_size
                if start >= size or end == start:
                    return b""
                f.seek(start)
                return f.read(min(end, size) - start)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFoundError(f"local: no object {key!r}") from None
        except OSError as e:
            raise self._oserror("read", key, e) from e

    def _head(self, key: str) -> ObjectInfo:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFoundError(f"local: no object {key!r}") from None
        except OSError as e:
            raise self._oserror("head", key, e) from e
        if not os.path.isfile(self._path(key)):
            raise ObjectNotFoundError(f"local: no object {key!r}")
        return ObjectInfo(key, st.st_size, None, st.st_mtime)

    def _walk(
        self,
        directory: Path,
        dir_key: str,
        prefix: str,
        start_after: str | None,
        keys: list[str] | None = None,
    ) -> Iterator[ObjectInfo]:
        """Yield objects under ``directory`` in key order, pruning subtrees outside the range;
        ``keys``: its entries' keys when already known (:func:`_sorted_keys`), else listed here."""
        if keys is None:
            try:
                keys = _sorted_keys(directory, dir_key)
            except (FileNotFoundError, NotADirectoryError):
                return
        for key in keys:
            if key.endswith("/"):
                if not (key.startswith(prefix) or prefix.startswith(key)):
                    continue
                if start_after is not None and key <= start_after and not start_after.startswith(key):
                    continue
                yield from self._walk(directory / key[len(dir_key) : -1], key, prefix, start_after)
            else:
                if not key.startswith(prefix) or (start_after is not None and key <= start_after):
                    continue
                try:
                    st = os.stat(directory / key[len(dir_key) :], follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted while listing
                yield ObjectInfo(key, st.st_size, None, st.st_mtime)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        # Start at the deepest directory that contains every key with this prefix.
        base = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        keys = None
        if prefix and not base:  # inside a root entry's name: those entries, from the kept listing
            try:
                kept = self._root_keys.get(self.root)
            except OSError as e:
                raise self._oserror("list", prefix, e) from e
            first = bisect.bisect_left(kept, prefix)  # from there, the keys with the prefix come first
            past = bisect.bisect_left(kept, True, first, key=lambda k: not k.startswith(prefix))
            keys = kept[first:past]
        found = self._walk(self.root.joinpath(*base.split("/")), base, prefix, start_after, keys)
        try:
            out: list[ObjectInfo] = []
            for info in found:
                out.append(info)
                if len(out) > limit:
                    break
        except OSError as e:
            raise self._oserror("list", prefix, e) from e
        return page_from_sorted(out, limit)
