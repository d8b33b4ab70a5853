"""What every fuzz test shares: the budget profiles, the property checker and the byte mutators.

Budget: ``HYPOTHESIS_PROFILE`` picks a profile for the fuzz tests only (other suites keep
Hypothesis' defaults): ``fuzz-ci`` (the default, part of the normal pytest run, bounded so the whole
fuzz suite stays well under a minute on 2 cores) or ``fuzz`` (``make fuzz``: many more examples).
See docs/fuzzing.md.

The property (:func:`expect_clean`): a parser given any bytes either returns or raises an
:class:`~rlm.errors.RlmError` whose message is one non-empty line; anything else (IndexError,
struct.error, OverflowError, a Rust panic, ...) fails the example, as does running longer than
:data:`HANG_SECONDS` (a SIGALRM guard: a real hang is reported as one, not as a stuck run).
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import zlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import crc32c
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rlm.errors import RlmError

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fuzz-ci")
if PROFILE not in ("fuzz", "fuzz-ci"):
    PROFILE = "fuzz-ci"  # another suite's profile name: the fuzz tests keep their own bounded budget

_COMMON: dict[str, Any] = {
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
    "derandomize": False,
    "print_blob": True,
}
# deadline: a per-example bound (generous: a shared 2-core machine); the SIGALRM guard below
# catches true hangs, which a Hypothesis deadline only reports after the example returns.
settings.register_profile("fuzz-ci", max_examples=100, deadline=timedelta(seconds=5), **_COMMON)
settings.register_profile("fuzz", max_examples=4_000, deadline=timedelta(seconds=5), **_COMMON)


def fuzz_settings(scale: float = 1.0, *, cap: int | None = None) -> settings:
    """The active fuzz profile, ``max_examples`` scaled (cheap parsers take more, subprocesses fewer)
    and at most ``cap``."""
    base = settings.get_profile(PROFILE)
    examples = max(3, int(base.max_examples * scale))
    return settings(base, max_examples=min(examples, cap) if cap else examples)


HANG_SECONDS = 10.0


class Hang(Exception):
    """Raised by the SIGALRM guard inside a parser that ran past :data:`HANG_SECONDS`."""


@contextlib.contextmanager
def hang_guard(seconds: float = HANG_SECONDS) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"parser still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


T = TypeVar("T")


def expect_clean(fn: Callable[..., T], *args: Any, located: bool = False, **kwargs: Any) -> T | RlmError:
    """Run ``fn``; return its result or the :class:`RlmError` it raised (any other exception fails).

    ``located``: the layer knows where in its input it was, so the error must carry a byte
    ``position`` or a Kafka ``offset``.
    """
    try:
        with hang_guard():
            return fn(*args, **kwargs)
    except RlmError as err:
        text = str(err)
        assert text.strip() and "\n" not in text, f"error message is not one line: {text!r}"
        assert err.reason, "error without a reason"
        if located:
            assert err.position is not None or err.offset is not None, f"error without a location: {text}"
        return err


# --- mutators ----------------------------------------------------------------------------------

#: Values that break length / count / offset arithmetic most often.
INTERESTING = (
    0,
    1,
    2,
    7,
    11,
    12,
    13,
    14,
    17,
    45,
    46,
    60,
    61,
    62,
    127,
    128,
    255,
    256,
    4096,
    65535,
    2**15 - 1,
    2**31 - 1,
    2**32 - 1,
    2**63 - 1,
    -1,
    -2,
    -(2**31),
    -(2**63),
)
_WIDTHS = {1: ">B", 2: ">H", 4: ">I", 8: ">Q"}


def _put_int(buf: bytearray, pos: int, width: int, value: int) -> None:
    if pos + width <= len(buf):
        struct.pack_into(_WIDTHS[width], buf, pos, value % (1 << (8 * width)))


@st.composite
def mutated(draw: st.DrawFn, seed: bytes, max_ops: int = 4) -> bytes:
    """``seed`` after 1..max_ops of: bit flip, byte set, insert, delete, truncate, duplicate a
    range, or an int field (1/2/4/8 bytes, big-endian) overwritten with an interesting value."""
    buf = bytearray(seed)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(("flip", "set", "insert", "delete", "truncate", "dup", "int", "int")))
        n = len(buf)
        pos = draw(st.integers(0, max(0, n - 1)))
        if op == "flip" and n:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and n:
            buf[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and n:
            del buf[pos : pos + draw(st.integers(1, 16))]
        elif op == "truncate":
            del buf[pos:]
        elif op == "dup" and n:
            buf[pos:pos] = buf[pos : pos + draw(st.integers(1, 64))]
        elif op == "int":
            width = draw(st.sampled_from((1, 2, 4, 8)))
            value = draw(st.sampled_from(INTERESTING) | st.integers(-(2**63), 2**64 - 1))
            _put_int(buf, pos, width, value)
    return bytes(buf)


def fix_crcs(data: bytes) -> bytes:
    """Recompute the CRC of every entry that can be walked (v2: CRC-32C over [21, end); v0/v1: CRC-32
    over [16, end)), so a mutation reaches the code behind the CRC check instead of stopping there."""
    buf = bytearray(data)
    pos = 0
    while len(buf) - pos >= 17:
        (size,) = struct.unpack_from(">i", buf, pos + 8)
        end = pos + 12 + size
        if size < 14 or end > len(buf):
            break
        magic = buf[pos + 16]
        if magic == 2 and size >= 49:
            struct.pack_into(">I", buf, pos + 17, crc32c.crc32c(bytes(buf[pos + 21 : end])))
        elif magic in (0, 1):
            struct.pack_into(">I", buf, pos + 12, zlib.crc32(bytes(buf[pos + 16 : end])))
        pos = end
    return bytes(buf)


def crc_fixed(seed: bytes, max_ops: int = 4) -> st.SearchStrategy[bytes]:
    """Mutations of ``seed`` whose record CRCs are then made valid again."""
    return mutated(seed, max_ops).map(fix_crcs)
