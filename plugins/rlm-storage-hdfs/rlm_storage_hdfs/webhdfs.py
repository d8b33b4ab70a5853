"""The WebHDFS REST calls the ``hdfs`` backend makes itself, on fsspec's ``WebHDFS`` session (its
user, Kerberos, TLS and timeouts), where fsspec's file objects cost more than the REST API needs:

* **write**: one ``CREATE`` at the NameNode (answered 307 to a DataNode) and one ``PUT`` streaming
  the body to that DataNode, chunked. fsspec's writer creates an empty file and then ``APPEND``\\s
  each 5 MiB block: four or more requests, and an HDFS append (a new block generation) per block;
* **publish**: ``RENAME`` with ``renameoptions`` (HDFS ``rename2``): ``NONE`` refuses an existing
  destination (an atomic create-if-absent, ``FileAlreadyExistsException``), ``OVERWRITE`` replaces
  it in one step, so no reader ever sees the key missing (fsspec: delete, then rename);
* **read**: one ``OPEN`` with ``offset``/``length`` (307 to a DataNode) and one ``GET`` there.
  fsspec's ``cat_file`` asks ``GETFILESTATUS`` first.

HDFS's ``RemoteException`` names decide the Python exception: ``FileNotFoundException`` →
FileNotFoundError, ``FileAlreadyExistsException`` → FileExistsError, ``AccessControlException`` →
PermissionError; a NameNode in safe mode, a
standby or one asking to retry (``SafeModeException``, ``RetriableException``, ``StandbyException``),
and the network failures a DataNode relays from its own call to the NameNode (``EOFException``,
``ConnectException``, …; OPEN's own EOFException is a seek past the end, not one) →
:class:`~rlm.errors.TransientStorageError`. Any other answer ≥ 400 is ``requests.HTTPError``, transient
when 429 or 5xx (the backend's ``_is_transient``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

from rlm.errors import TransientStorageError

__all__ = ["WebHdfsRest"]

CHUNK = 1 << 20  # bytes per chunk of a streamed upload or download
_REMOTE: dict[str, type[OSError]] = {
    "FileNotFoundException": FileNotFoundError,
    "FileAlreadyExistsException": FileExistsError,
    "AccessControlException": PermissionError,
    "SecurityException": PermissionError,
}
#: Retrying heals these: a NameNode busy, in safe mode or standby, and the network failures a
#: DataNode (or an HttpFS gateway) relays from its own call to the NameNode — e.g. EOFException
#: from the connection a restarted NameNode dropped.
_TRANSIENT = frozenset(
    {
        "SafeModeException",
        "RetriableException",
        "StandbyException",
        "EOFException",
        "ConnectException",
        "SocketTimeoutException",
        "NoRouteToHostException",
    }
)
_MAX_ERROR_BYTES = 64 << 10  # a RemoteException is a few hundred bytes of JSON


class WebHdfsRest:
    """REST calls on ``fs`` (fsspec's ``WebHDFS``: ``session``, ``url``, ``pars``)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def call(self, op: str, method: str, path: str, **params: Any) -> Any:
        """One NameNode request, redirects not followed; the response (raises as the module says)."""
        fs = self.fs
        url = fs._apply_proxy(fs.url + quote(path, safe="/="))
        resp = fs.session.request(method, url, params={**params, **fs.pars, "op": op}, allow_redirects=False)
        _check(op, path, resp)
        return resp

    def _datanode(self, resp: Any) -> str | None:
        location = resp.headers.get("Location")
        return None if location is None else str(self.fs._apply_proxy(location))

    def create(self, path: str, stream: BinaryIO, **params: Any) -> int:
        """Write ``stream`` (read to EOF) as the new file ``path`` (parents created; an existing
        file is an error: rlm writes only fresh temp names). Returns the bytes written."""
        first = self.call("CREATE", "PUT", path, overwrite="false", **params)
        target = self._datanode(first)
        if target is None:
            raise OSError(f"WebHDFS CREATE {path}: the NameNode named no DataNode to write to")
        body = _Counted(stream)
        resp = self.fs.session.put(
            target,
            data=iter(body),
            headers={"content-type": "application/octet-stream"},
            allow_redirects=False,
        )
        _check("CREATE", path, resp)
        return body.total

    def rename(self, src: str, dst: str, *, overwrite: bool) -> None:
        """``src`` becomes ``dst`` in one NameNode step; FileExistsError when ``dst`` exists and
        not ``overwrite``; FileNotFoundError when ``dst``'s parent directory does not exist."""
        self.call("RENAME", "PUT", src, destination=dst, renameoptions="OVERWRITE" if overwrite else "NONE")

    def open(self, path: str, offset: int, length: int | None) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``path`` (to its end when ``length`` is None;
        fewer at the end). Never more than ``length`` bytes are taken from the DataNode."""
        params: dict[str, Any] = {"offset": offset}
        if length is not None:
            params["length"] = length
        first = self.call("OPEN", "GET", path, **params)
        target = self._datanode(first)
        if target is None:  # a gateway (HttpFS) answers with the bytes itself
            return _bounded(first, length)
        resp = self.fs.session.get(target, stream=True, allow_redirects=False)
        try:
            _check("OPEN", path, resp)
            return _bounded(resp, length)
        finally:
            resp.close()


class _Counted:
    """``stream`` as an iterator of chunks, counting the bytes (requests sends it chunked)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.total = 0

    def __iter__(self) -> Iterator[bytes]:
        while chunk := self.stream.read(CHUNK):
            self.total += len(chunk)
            yield chunk


def _bounded(resp: Any, length: int | None) -> bytes:
    if length is None:
        return bytes(resp.content)
    out = bytearray()
    for chunk in resp.iter_content(CHUNK):
        out += chunk
        if len(out) >= length:
            break
    return bytes(out[:length])


def _check(op: str, path: str, resp: Any) -> None:
    if resp.status_code < 400:
        return
    name, message = _remote_exception(resp)
    text = f"WebHDFS {op} {path}: {name or resp.status_code}: {message}"
    # OPEN's own EOFException is a seek past the end (an empty file, an offset at its end): not
    # a dropped connection, and retrying cannot heal it
    if name in _TRANSIENT and not (op == "OPEN" and name == "EOFException"):
        raise TransientStorageError(f"hdfs: {text}")
    if name in _REMOTE:
        raise _REMOTE[name](text)
    resp.raise_for_status()


def _remote_exception(resp: Any) -> tuple[str, str]:
    """``(exception, message)`` of a WebHDFS error body (its first 64 KiB: a RemoteException is a
    few hundred bytes); ``("", reason)`` when it is not one."""
    try:
        remote = json.loads(next(resp.iter_content(_MAX_ERROR_BYTES), b""))["RemoteException"]
        return str(remote.get("exception", "")), str(remote.get("message", ""))
    except Exception:  # not JSON, not a RemoteException: the status says enough
        return "", str(resp.reason)
