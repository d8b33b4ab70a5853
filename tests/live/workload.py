"""A continuous producer for the live suites: real clients (kafka-python and confluent-kafka),
idempotent and transactional (commits, aborts, transactions left open across other writes), every
codec, in a background thread the test can pause at any step and resume.

A step is one burst through one producer: an idempotent burst (flushed), or a transaction that is
committed, aborted, or left open and settled by a later step of the same producer. Every step
flushes what it sent, so when :meth:`Workload.pause` returns every record sent is on the broker; only
what the transaction coordinator writes on its own (the COMMIT/ABORT markers of a transaction
ended just before the pause, written asynchronously after EndTxn returns) may still land, which
the suites' comparisons detect as a moving broker and retry.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: client × mode: kafka-python ("kp") and confluent-kafka/librdkafka ("ck"), idempotent or transactional.
KINDS = ("kp-idem", "kp-txn", "ck-idem", "ck-txn")

Target = tuple[str, int]  # topic, partition
#: A transaction left open while a test compares (minutes on a busy machine) must not time out:
#: the coordinator would abort it and fence its producer. Kafka's transaction.max.timeout.ms is 15 min.
TXN_TIMEOUT_MS = 600_000


class _Client:
    """One producer behind one interface (the two libraries name the same calls differently)."""

    def __init__(self, kind: str, codec: str, bootstrap: str, txn_id: str | None) -> None:
        self.kind, self.codec, self.transactional = kind, codec, txn_id is not None
        self.errors: list[str] = []
        self._futures: list[Any] = []  # kafka-python's sends since the last flush
        if kind.startswith("kp"):
            from kafka import KafkaProducer

            self._kp: Any = KafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                enable_idempotence=True,
                compression_type=None if codec == "none" else codec,
                linger_ms=5,
                transactional_id=txn_id,
                transaction_timeout_ms=TXN_TIMEOUT_MS,
                request_timeout_ms=30000,
            )
            self._ck: Any = None
        else:
            from confluent_kafka import Producer

            conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "compression.type": codec}
            conf |= {"linger.ms": 5, "log_level": 3, "transaction.timeout.ms": TXN_TIMEOUT_MS}
            conf |= {"transactional.id": txn_id} if txn_id else {}
            self._ck, self._kp = Producer(conf), None
        if self.transactional:
            (self._kp or self._ck).init_transactions(*(() if self._kp else (60,)))

    def send(
        self, target: Target, key: bytes | None, value: bytes | None, headers: list[Any], ts: int | None
    ) -> None:
        topic, partition = target
        if self._kp is not None:
            self._futures.append(
                self._kp.send(
                    topic, value=value, key=key, headers=headers, partition=partition, timestamp_ms=ts
                )
            )
            return
        self._ck.produce(
            topic,
            value=value,
            key=key,
            partition=partition,
            headers=headers,
            on_delivery=self._delivered,
            **({"timestamp": ts} if ts is not None else {}),
        )

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{self.kind}/{self.codec}: {err}")

    def flush(self) -> None:
        """Until every record sent is acknowledged; raises if one was not."""
        if self._kp is not None:
            self._kp.flush(timeout=60)
            sent, self._futures = self._futures, []
            for future in sent:
                future.get(timeout=60)  # raises the send's error
        elif self._ck.flush(60) != 0:
            raise RuntimeError(f"{self.kind}/{self.codec}: messages still queued after 60 s")
        if self.errors:
            raise RuntimeError(f"delivery failed: {self.errors[:3]}")

    def begin(self) -> None:
        (self._kp or self._ck).begin_transaction()

    def end(self, commit: bool) -> None:
        client = self._kp or self._ck
        finish = client.commit_transaction if commit else client.abort_transaction
        finish(*(() if self._kp is not None else (60,)))

    def close(self) -> None:
        if self._kp is not None:
            self._kp.close(timeout=30)
        else:
            self._ck.flush(30)
            self._ck.close()


@dataclass
class Counts:
    """What the workload did so far (records, batches flushed, transactions by outcome)."""

    steps: int = 0
    records: int = 0
    committed: int = 0
    aborted: int = 0
    left_open: int = 0


@dataclass
class Workload:
    """Produce to ``targets`` (codec → the partitions its producers write) until :meth:`stop`.

    ``value_bytes``: per topic, the random bytes of a value (a codec cannot shrink them away;
    half as many compressible bytes follow); ``weights``: per codec, how often its producers
    are picked (1 by default); ``old_timestamps``: some records carry a timestamp up to 10 minutes
    in the past, so that timestamps do not rise with offsets. ``gap_s`` spaces the steps (the
    rate, not a wait).
    """

    bootstrap: str
    targets: Mapping[str, Sequence[Target]]
    value_bytes: Mapping[str, int] = field(default_factory=dict)
    weights: Mapping[str, int] = field(default_factory=dict)
    records_per_step: tuple[int, int] = (1, 20)
    old_timestamps: bool = False
    gap_s: float = 0.02
    seed: int = 29
    counts: Counts = field(default_factory=Counts)
    per_client: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, codec) → records
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._paused = threading.Event()
        self._resume = threading.Event()
        self._open: dict[tuple[str, str], list[Target]] = {}  # (kind, codec) → partitions of its open txn
        self._clients: dict[tuple[str, str], _Client] = {}
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name="live-workload", daemon=True)

    # -- control (the test's thread) ---------------------------------------------------------------

    def start(self) -> Workload:
        self._thread.start()
        return self

    def pause(self, timeout: float = 120) -> list[tuple[str, str]]:
        """Stop at the next step boundary (everything sent is flushed); the producers whose
        transaction is open now. Raises what failed the producing thread."""
        self._resume.clear()
        self._pause.set()
        deadline = time.monotonic() + timeout
        while not self._paused.wait(0.2):
            self._check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workload did not pause within {timeout:.0f} s")
        return sorted(self._open)

    def resume(self) -> None:
        self._pause.clear()
        self._paused.clear()
        self._resume.set()

    def wait_steps(self, steps: int, timeout: float = 120) -> None:
        """Until ``steps`` more steps were done (the workload keeps producing meanwhile)."""
        want = self.counts.steps + steps
        deadline = time.monotonic() + timeout
        while self.counts.steps < want:
            self._check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workload did not make {steps} steps within {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Settle open transactions (committed), flush and close every producer."""
        self._stop.set()
        self.resume()
        self._thread.join(timeout=180)
        self._check()

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the producing thread failed: {self.error!r}") from self.error

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.resume()
        self._thread.join(timeout=180)

    # -- the producing thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            for codec in self.targets:
                for kind in KINDS:
                    txn_id = f"live-{self.seed}-{kind}-{codec}" if kind.endswith("txn") else None
                    self._clients[(kind, codec)] = _Client(kind, codec, self.bootstrap, txn_id)
            while not self._stop.is_set():
                if self._pause.is_set():
                    self._paused.set()
                    self._resume.wait()
                    continue
                self._step()
                self.counts.steps += 1
                time.sleep(self.gap_s)
            for key in list(self._open):
                self._end(key, commit=True)
        except BaseException as err:  # reported to the test by pause/wait_steps/stop
            self.error = err
            self._paused.set()
        finally:
            for client in self._clients.values():
                try:
                    client.close()
                except Exception as err:
                    self.error = self.error or err

    def _step(self) -> None:
        codecs = list(self.targets)
        codec = self._rng.choices(codecs, [self.weights.get(c, 1) for c in codecs])[0]
        kind = self._rng.choice(KINDS)
        key = (kind, codec)
        client = self._clients[key]
        if not client.transactional:
            self._burst(client, self._rng.choice(self.targets[codec]))
            client.flush()
            return
        if key in self._open:  # settle the transaction left open by an earlier step
            self._end(key, commit=self._rng.random() < 0.6)
            return
        parts = list(self.targets[codec])
        chosen = self._rng.sample(parts, self._rng.randint(1, len(parts)))
        client.begin()
        for target in chosen:
            self._burst(client, target)
        client.flush()
        fate = self._rng.random()
        if fate < 0.2:
            self._open[key] = chosen
            self.counts.left_open += 1
        else:
            self._end(key, commit=fate < 0.65, opened=False)

    def _end(self, key: tuple[str, str], *, commit: bool, opened: bool = True) -> None:
        if opened:
            del self._open[key]
        self._clients[key].end(commit)
        if commit:
            self.counts.committed += 1
        else:
            self.counts.aborted += 1

    def _burst(self, client: _Client, target: Target) -> None:
        size = self.value_bytes.get(target[0], 300)
        for _ in range(self._rng.randint(*self.records_per_step)):
            self._seq += 1
            n = self._seq
            key = None if n % 17 == 0 else f"{client.kind}-{client.codec}-{n}".encode()
            value = (
                None
                if n % 29 == 0 and key is not None
                else f"{n:08d}".encode() + os.urandom(size) + b"abc" * (size // 6)
            )
            headers = [] if n % 3 else [("n", str(n).encode()), ("kind", client.kind.encode())]
            ts = None
            if self.old_timestamps and n % 5 == 0:
                ts = int(time.time() * 1000) - self._rng.randint(1, 600_000)
            client.send(target, key, value, headers, ts)
            self.counts.records += 1
            self.per_client[(client.kind, client.codec)] = (
                self.per_client.get((client.kind, client.codec), 0) + 1
            )
