"""rlm/daemon/allocator.py: a store read's block comes from the heap and its memory stays there
for the next one, instead of a mapping of its own given back to the kernel when freed (each page
of it then faulted in again: BENCHMARKS.md, #35)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlm.daemon.allocator import MMAP_THRESHOLD, tune_allocator

# In a fresh interpreter (the allocator's settings are process-wide): a block of 20 MiB, where it
# was served from and what is left of it once freed. Mappings from /proc/self/maps.
_PROBE = """
import json, sys
from rlm.daemon.allocator import tune_allocator
tuned = tune_allocator({}) if sys.argv[1] == "tuned" else None
def maps():
    out = {}
    for line in open("/proc/self/maps"):
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        out[fields[0]] = (hi - lo, fields[5] if len(fields) > 5 else "")
    return out
before = maps()
block = bytearray(20 << 20)
during = maps()
del block
after = maps()
new = [size for k, (size, name) in during.items() if k not in before and not name]
heap = lambda m: max((size for size, name in m.values() if name == "[heap]"), default=0)
print(json.dumps({"tuned": tuned, "own_mapping": [s for s in new if s >= 20 << 20],
                  "heap_during": heap(during), "heap_after": heap(after)}))
"""


def _probe(mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return dict(json.loads(done.stdout))


def test_a_large_block_comes_from_the_heap_and_stays_there_once_freed() -> None:
    default, tuned = _probe("default"), _probe("tuned")
    assert default["own_mapping"], default  # glibc's default: a mapping of its own, unmapped when freed
    assert tuned["tuned"] is True and not tuned["own_mapping"], tuned
    assert tuned["heap_during"] >= 20 << 20 and tuned["heap_after"] >= 20 << 20, tuned  # kept
    assert MMAP_THRESHOLD > 20 << 20


@pytest.mark.parametrize(
    "environ",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
        {"MALLOC_TRIM_THRESHOLD_": "1"},
        {"MALLOC_ARENA_MAX": "2"},
    ],
)
def test_an_operators_own_malloc_tuning_wins(environ: dict[str, str]) -> None:
    assert tune_allocator(environ) is False
