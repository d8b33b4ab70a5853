"""``make demo-kafka``: a single-node Kafka, a producer and rlm beside it, until Ctrl-C.

A newcomer watches the real thing: the broker rolls 1 MiB segments of a topic while a producer
writes to it; rlm tiers each rolled segment into a local folder and the status page shows it; the
broker keeps only ~4 MiB locally (``retention.bytes``), so older offsets are answered by rlm alone
(its Kafka listener serves both tiers). Everything listens on loopback; Ctrl-C stops the producer,
rlm and the broker (by pid) and leaves their files under ``--dir`` for a look.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import threading
import time
from pathlib import Path

from rlm.testing.daemon import free_port, run_daemon, wait_healthy
from rlm.testing.kafka_cluster import KafkaCluster
from rlm.testing.sidecar import sidecar_config

MiB = 1024 * 1024


def _produce(bootstrap: str, topic: str, rate_bytes: int, stop: threading.Event) -> None:
    """About ``rate_bytes`` per second of 1 KiB records (random, so compression keeps them big)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, compression_type="lz4")
    try:
        n = 0
        while not stop.is_set():
            started = time.monotonic()
            for _ in range(max(1, rate_bytes // 1024 // 10)):
                producer.send(topic, key=f"k{n}".encode(), value=os.urandom(512).hex().encode())
                n += 1
            stop.wait(max(0.0, 0.1 - (time.monotonic() - started)))
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("demo-kafka"), help="where everything is kept")
    parser.add_argument("--port", type=int, default=9464, help="rlm's HTTP API and status page")
    parser.add_argument("--rate", type=int, default=MiB // 4, help="producer bytes per second")
    args = parser.parse_args(argv)
    shutil.rmtree(args.dir, ignore_errors=True)
    topic = "demo-orders"
    kafka = KafkaCluster(args.dir / "kafka", size=1)
    stop = threading.Event()
    producer: threading.Thread | None = None
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print("starting a single-node Kafka (KRaft) ...", flush=True)
        kafka.start()
        kafka.create_topic(topic, configs={"segment.bytes": MiB, "retention.bytes": 4 * MiB})
        kafka_port = free_port()
        config = sidecar_config(
            args.dir / "rlm.toml",
            kafka.nodes[0],
            args.dir / "tiered",
            http_port=args.port,
            kafka_port=kafka_port,
        )
        producer = threading.Thread(target=_produce, args=(kafka.bootstrap, topic, args.rate, stop))
        producer.start()
        with run_daemon(config, args.port, args.dir / "rlm.log", wait=False) as daemon:
            wait_healthy(daemon, timeout=120)
            print(
                f"Kafka broker   {kafka.bootstrap}  (topic {topic}: 1 MiB segments, 4 MiB kept locally)\n"
                f"status page    {daemon.url}/\n"
                f"rlm's listener 127.0.0.1:{kafka_port}  e.g. kcat -C -b 127.0.0.1:{kafka_port} "
                f"-t {topic} -o beginning -e\n"
                f"rlm's log      {args.dir / 'rlm.log'}\nCtrl-C stops everything.",
                flush=True,
            )
            while not stop.is_set() and daemon.proc.poll() is None:
                stop.wait(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if producer is not None:
            producer.join(timeout=60)
        kafka.close()


if __name__ == "__main__":
    main()
