"""The C allocator tuned for a daemon that streams store bytes: :func:`tune_allocator`.

A catch-up reads the store in GETs of up to 8 MiB (``readahead.COALESCE_BYTES``) on a pool of
threads, and each GET's bytes go once the fetches that use them are answered. By default glibc's
``malloc`` serves a block of 128 KiB or more with a mapping of its own (raising that threshold as
such blocks are freed), gives free memory at a heap's top back to the kernel past twice that
threshold, and unmaps a thread's spare heaps. So the memory of a freed GET mostly goes back to
the kernel and the next GET faults in fresh pages: a page fault and a page of zeros each, and on
a VM whose freed pages go back to its host (virtio-balloon free page reporting, as on the bench
host) a fault in the host too, ~20 µs a page. That was most of a first catch-up's CPU
(BENCHMARKS.md "Beside Kafka's own tiered storage", #35).

:func:`tune_allocator` fixes both thresholds: blocks up to :data:`MMAP_THRESHOLD` bytes come from
the heaps, so a freed GET's memory serves the next one, and up to :data:`TRIM_THRESHOLD` bytes
free at a heap's top are kept. What rlm holds stays within its own bounds (range cache, read-ahead,
upload buffers); the process keeps at most what it held at its peak on top.

glibc only (``mallopt``); elsewhere nothing changes. Nor does it when the environment already
tunes ``malloc`` (``GLIBC_TUNABLES`` naming ``glibc.malloc``, or a ``MALLOC_*`` variable): an
operator's choice wins.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]

log = logging.getLogger(__name__)

#: Blocks below this many bytes come from the heaps (glibc's largest allowed value on 64-bit).
MMAP_THRESHOLD = 32 << 20
#: Free bytes at a heap's top kept rather than given back to the kernel.
TRIM_THRESHOLD = 256 << 20

# mallopt(3) parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _operator_tuned(environ: Mapping[str, str]) -> bool:
    return "glibc.malloc" in environ.get("GLIBC_TUNABLES", "") or any(
        name.startswith("MALLOC_") for name in environ
    )


def tune_allocator(environ: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap and trim thresholds (module doc); True when both were set, False when
    there is no glibc ``mallopt``, the environment tunes ``malloc`` itself, or glibc refused."""
    if _operator_tuned(os.environ if environ is None else environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own allocator, untouched
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not done:
        log.warning("malloc refused rlm's thresholds; store reads may fault in fresh memory")
    return done
