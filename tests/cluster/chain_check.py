"""An independent checker of a partition's remote state after leader changes (docs/cluster.md).

Written from the raw manifest JSON in the store and the generator's own record of the final
lineage (every batch the final leader holds, its leader-epoch-checkpoint), never from rlm's chain
or lineage code, so a bug there cannot hide itself:

* each manifest's *effective* end is cut by Kafka's ``endOffsetFor`` rule: data of epoch E at or
  beyond the offset where E ends in the final lineage is not part of the log;
* the effective chain: manifests by base offset, those with nothing effective dropped (diverged),
  one overlapping the previous kept one dropped (superseded);
* the chain must cover [remote start, expected end] with no gap, and every byte of every batch it
  serves must be the final lineage's batch at that offset.
"""

from __future__ import annotations

import itertools
import json
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from rlm.formats.checkpoint import EpochEntry
from rlm.testing.replicas import Batch, ReplicatedPartition
from tests.cluster.rig import RawStore

MANIFEST_KEY = re.compile(r"manifests/([0-9]{20})\.json$")
LOG_OBJECT = "/segment.log"


def split_batches(data: bytes) -> list[tuple[int, bytes]]:
    """(base offset, bytes) of each v2 batch: baseOffset int64, then batchLength int32 (the bytes
    after the length field). Written here, not taken from rlm, to stay independent."""
    out, pos = [], 0
    while pos < len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        assert end <= len(data), f"truncated batch at byte {pos}"
        out.append((base, data[pos:end]))
        pos = end
    return out


def end_offset_for(epoch: int, lineage: list[EpochEntry], log_end: int) -> int:
    """Kafka's ``LeaderEpochFileCache.endOffsetFor``: where ``epoch`` ends in ``lineage`` (the start
    of the first higher epoch; the log end for the latest); -1 for an epoch above the latest."""
    if not lineage or epoch > lineage[-1].epoch:
        return -1
    for entry in lineage:
        if entry.epoch > epoch:
            return entry.start_offset
    return log_end


def effective_last(doc: dict[str, Any], lineage: list[EpochEntry], log_end: int) -> int:
    """The last offset of a manifest that belongs to the lineage (``base_offset - 1`` if none)."""
    base, last = doc["base_offset"], doc["last_offset"]
    epochs = sorted(((int(e), int(s)) for e, s in doc.get("leader_epochs", [])), key=lambda es: es[1])
    for i, (epoch, start) in enumerate(epochs):
        span_start = max(start, base)
        span_end = epochs[i + 1][1] - 1 if i + 1 < len(epochs) else last
        if span_end < base:
            continue  # an entry that ends before this segment begins
        end = end_offset_for(epoch, lineage, log_end)
        if end <= span_end:
            return max(span_start, end) - 1
    return last


@dataclass
class Link:
    base: int
    last: int  # effective
    doc: dict[str, Any]


@dataclass
class ChainReport:
    chain: list[Link]
    diverged: list[int] = field(default_factory=list)  # bases of manifests with nothing effective
    superseded: list[int] = field(default_factory=list)  # bases of manifests overlapping the chain
    stored_log_bytes: int = 0  # every segment.log object under the root
    tiered_bytes: int = 0  # the final lineage's bytes the chain covers
    lineage_markers: list[str] = field(default_factory=list)

    @property
    def extra(self) -> list[int]:
        return self.diverged + self.superseded


def manifests(store: RawStore, root: str) -> dict[int, dict[str, Any]]:
    out = {}
    for key in store.list(root + "manifests/"):
        m = MANIFEST_KEY.search(key)
        if m:
            doc = json.loads(store.read(key))
            assert doc["base_offset"] == int(m.group(1)), key
            out[doc["base_offset"]] = doc
    return out


def check_partition_chain(
    store: RawStore,
    root: str,
    part: ReplicatedPartition,
    lineage: list[EpochEntry],
    expected_end: int,
    *,
    remote_start: int = 0,
) -> ChainReport:
    """Assert the effective chain of ``root`` holds exactly [remote_start, expected_end] of the
    final lineage, byte for byte; return what else is stored."""
    docs = manifests(store, root)
    report = ChainReport(chain=[])
    log_end = part.log_end_offset
    for base in sorted(docs):
        doc = docs[base]
        eff = effective_last(doc, lineage, log_end)
        if eff < base:
            report.diverged.append(base)
        elif report.chain and base <= report.chain[-1].last:
            report.superseded.append(base)
        else:
            report.chain.append(Link(base, eff, doc))
    ranges = [(link.base, link.last) for link in report.chain]
    assert ranges, f"{root}: no manifest in the chain"
    assert ranges[0][0] == remote_start, f"{root}: chain starts at {ranges[0][0]}, not {remote_start}"
    for (_, last), (base, _) in itertools.pairwise(ranges):
        assert base == last + 1, f"{root}: gap or overlap between {last} and {base}: {ranges}"
    assert ranges[-1][1] == expected_end, f"{root}: chain ends at {ranges[-1][1]}, not {expected_end}"
    canonical: dict[int, Batch] = {b.base_offset: b for b in part.log}
    for link in report.chain:
        data = store.read(link.doc["objects"]["log"]["key"])
        assert len(data) == link.doc["objects"]["log"]["size"] == link.doc["size_bytes"]
        batches = split_batches(data)
        assert batches[0][0] == link.base, f"{root}: manifest {link.base} starts with batch {batches[0][0]}"
        expect = link.base
        for base, raw in batches:
            if base > link.last:
                break  # the diverged rest of a cut manifest: never served
            batch = canonical.get(base)
            assert base == expect and batch is not None, f"{root}: manifest {link.base}: batch {base}"
            assert raw == batch.data, f"{root}: manifest {link.base}: batch {base} differs from the lineage"
            assert batch.last_offset <= link.last, f"{root}: a batch straddles the cut at {link.last}"
            report.tiered_bytes += len(raw)
            expect = batch.last_offset + 1
        assert expect == link.last + 1, f"{root}: manifest {link.base} ends at {expect - 1}, not {link.last}"
    listing = store.list(root)
    report.stored_log_bytes = sum(size for key, size in listing.items() if key.endswith(LOG_OBJECT))
    report.lineage_markers = sorted(k for k in listing if "/lineage-" in k)
    return report
