"""One Kafka listener connection's state, and what a request's step in the pool hands back to the
event loop (rlm/kafka/server.py): an answer, a Fetch to wait for, a request to relay, or what is
left of a Fetch begun on the loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rlm.kafka.coordinator import RelaySession
from rlm.kafka.fetching import FetchPlan, FetchRead
from rlm.kafka.idle_watch import Owing
from rlm.kafka.on_loop import LoopTries
from rlm.kafka.protocol import Frame, RequestFrame

__all__ = ["Conn", "Relay", "Rest", "Waiting"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A Fetch read once without ``min_bytes`` of records: its plan (the session context, made
    once per request) and the read so far."""

    req: RequestFrame
    plan: FetchPlan
    read: FetchRead


@dataclass(frozen=True, slots=True)
class Rest:
    """What is left of a Fetch (or a ListOffsets) begun on the event loop whose read would wait:
    for the pool."""

    run: Callable[[], Frame | Waiting]


@dataclass(frozen=True, slots=True)
class Relay:
    """A group request for the cluster's coordinator: relayed on the event loop (it may be held
    for minutes), never in the pool (rlm/kafka/coordinator.py)."""

    req: RequestFrame
    frame: bytes


@dataclass(slots=True)
class Conn:
    """One client connection's state."""

    peer: str
    host: str  # the address the client reached: what Metadata advertises
    port: int
    key: tuple[str, str]  # who reads, for read-ahead (docs/read-path.md)
    owing: Owing  # what the idle watch sees of it (rlm/kafka/idle_watch.py)
    authenticated: bool
    handshake: bool = False  # SaslHandshake done: SaslAuthenticate (or a v0 raw token) may follow
    raw_token_next: bool = False
    close_after: bool = False
    auth_failed: bool = False  # why it is closed, for the metric
    user: str | None = None  # who SASL authenticated; None: nobody (DeleteRecords is refused)
    relay: RelaySession | None = None  # its upstream connections for relayed group requests
    on_loop: LoopTries = field(default_factory=LoopTries)  # its Fetches tried on the event loop
    offsets_on_loop: LoopTries = field(default_factory=LoopTries)  # its ListOffsets, likewise
