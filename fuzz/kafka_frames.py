"""Coverage-guided fuzzing (atheris, libFuzzer) of the Kafka listener's network surface: the frame
parser (``rlm/kafka/protocol.py``: ``peek_header``, ``parse_request``) and every request handler,
reached through the listener's own request step (``KafkaListener._step``: the authentication check,
the dispatch, the encoding) over a small real partition written by LogWriter (docs/fuzzing.md
"The Kafka listener", docs/kafka-listener.md §8).

The property: for any bytes a client can send as a frame, the listener answers an encoded response
(an error code where the request asks for something wrong) or refuses the frame with
:class:`rlm.errors.KafkaProtocolError` (the connection is closed); anything else — another
exception, a response larger than the Fetch bound allows — is a finding. libFuzzer's
``-rss_limit_mb`` catches unbounded allocation.

Run: ``make fuzz-kafka`` (minutes), or ``python fuzz/kafka_frames.py -runs=N`` (``make test`` runs a
bounded number in tests/kafka/test_fuzz_frames.py). The first input byte picks the connection's
state (authenticated or not, a SaslHandshake v0 token expected); the rest is the frame's bytes
after its 4-byte size. Seeds: one valid request of every served API at its lowest and highest
version, written into the corpus directory given on the command line (else a fresh one).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlm, run from anywhere

# Imported first, so not instrumented: the coverage that guides is the listener's, rlm/kafka
# (atheris instruments whole top-level packages; a module already imported is left alone).
# kafka-python's decoders are generated at run time (exec), which atheris does not instrument.
import kafka.protocol.consumer  # noqa: F401  (imports all of kafka-python)

from rlm.config import settings_from_mapping
from rlm.errors import KafkaProtocolError
from rlm.formats.records import RecordSpec
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.secrets import write_secret
from rlm.tiering.delete_records import DeletedRecords  # noqa: F401  (rlm.kafka.api's)
from rlm.tiering.read import TieredReaders

with atheris.instrument_imports(include=["rlm"]):
    from rlm.kafka.api import KafkaApi
    from rlm.kafka.idle_watch import Owing
    from rlm.kafka.protocol import SERVED
    from rlm.kafka.server import KafkaListener, _Conn, _Waiting
    from rlm.testing.kafka_wire import fetch_request

T0 = 1_760_000_000_000
FETCH_MAX = 64 * 1024  # the listener's response bound here: small, so a breach shows
BATCH_MAX = 4 * 1024  # the largest batch written below, bytes (with headers)
OVERHEAD = 1 << 20  # encoded partition and topic entries besides the records, for any request


def _listener(root: Path) -> KafkaListener:
    """A listener (not started: its request step is called directly) over partitions ``f-0`` and
    ``f-1`` — 40 small batches each, one gzip-compressed — with SASL/PLAIN on."""
    logs = root / "logs"
    for partition in range(2):
        with LogWriter(logs, "f", partition, clock=lambda: T0, segment_bytes=16 * 1024) as w:
            for i in range(40):
                w.append([RecordSpec(T0 + i, b"k%d" % i, b"v" * (i * 50)) for _ in range(1 + i % 3)])
            w.high_watermark = w.log_end_offset - 3
    users = write_secret(root / "users", "alice:secret\n")  # 0600: docs/security.md §6
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)]},
            "remote": {"backend": "local", "options": {"root": str(root / "store")}},
            "cluster": {"leadership": "always"},
            "kafka": {
                "listen": "127.0.0.1:0",
                "sasl_plain_users_file": str(users),
                "fetch_max_bytes": FETCH_MAX,
                "max_wait_ms": 0,
            },
        }
    )
    readers = TieredReaders(settings, LocalBackend(root=str(root / "store")))
    return KafkaListener(KafkaApi(readers), settings.kafka, threads=1)


def seeds() -> list[bytes]:
    """One valid request of every served API at its lowest and highest version (kafka-python's
    classes encode them), each prefixed by a state byte; and a PLAIN token."""
    out = [b"\x02\x00alice\x00secret"]
    for api in SERVED.values():
        for version in {api.min_version, api.max_version}:
            body = _example(api.key)
            if body is None:
                continue
            body.with_header(correlation_id=7, client_id="fuzz")
            try:
                out.append(b"\x01" + bytes(body.encode(version=version, header=True)))
            except Exception:  # a field this version lacks: the other version seeds it
                continue
    return out


def _example(key: int) -> Any:
    if key == 1:
        return fetch_request([("f", 0, 0), ("f", 1, 5)], max_bytes=FETCH_MAX * 4)
    cls = SERVED[key].request
    try:
        return cls()  # every field at its schema default
    except Exception:
        return None


def check(listener: KafkaListener, data: bytes) -> None:
    """One input: the property of the module doc, else an AssertionError or the exception itself."""
    if not data:
        return
    state, frame = data[0], data[1:]
    conn = _Conn("fuzz:1", "127.0.0.1", 9092, ("fuzz", "k"), Owing(None), authenticated=bool(state & 1))
    conn.raw_token_next = bool(state & 2)
    try:
        out = listener._step(conn, frame)
    except KafkaProtocolError:
        return
    if isinstance(out, _Waiting):  # max_wait_ms 0 in the settings: no wait, but the type is allowed
        out = listener._encode(out.req, out.answer.body)
    # a Fetch answer is parts (its records as read, rlm/kafka/protocol.py encode_fetch_response)
    parts = (out,) if isinstance(out, bytes | bytearray) else out
    assert isinstance(parts, tuple) and all(isinstance(p, bytes | bytearray | memoryview) for p in parts), out
    size = sum(len(p) for p in parts)
    assert int.from_bytes(bytes(parts[0][:4]), "big") == size - 4, "the frame's size prefix"
    assert size <= FETCH_MAX + BATCH_MAX + OVERHEAD + 8 * len(frame), (size, len(frame))


def main(argv: list[str]) -> None:
    """libFuzzer's command line; the seeds go into the first corpus directory given, else a fresh one."""
    root = Path(tempfile.mkdtemp(prefix="rlm-fuzz-kafka-"))
    listener = _listener(root)
    args = list(argv)
    dirs = [a for a in args[1:] if not a.startswith("-")]
    if not dirs:
        args.append(str(root / "corpus"))
    corpus = Path(dirs[0] if dirs else args[-1])
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds()):
        (corpus / f"seed-{i}").write_bytes(seed)
    atheris.Setup(args, lambda data: check(listener, data))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
