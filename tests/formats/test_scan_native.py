"""The compiled batch scan (rlm/formats/records/_scan.c) against the pure-Python reference walk.

Property: for any bytes (generated segments of every codec, v0/v1 messages, real broker segments,
mutations with and without CRCs fixed, torn tails, random bytes) and any start/end/verify_crc/
skip_crc, both walks yield equal RecordBatch sequences and end the same way: cleanly, or with the
same error class, message, position and offset. Out-of-bounds reads are caught by a guard page:
the input ends where a PROT_NONE page begins, so one byte read past it kills the test process.
docs/scan.md.
"""

from __future__ import annotations

import ctypes
import importlib.util
import mmap
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm.formats.compression import Compression
from rlm.formats.records import RecordBatch, RecordSpec, _scan, build_batch, iter_batches, scan, types
from tests.fuzz.harness import crc_fixed, fuzz_settings, mutated
from tests.fuzz.seeds import record_seeds

ROOT = Path(__file__).resolve().parents[2]
#: False under RLM_SCAN=python: iter_batches then runs the reference, and the scanner is driven
#: directly below (bound here as scan.py binds it).
NATIVE_ACTIVE = scan.SCAN_IMPL != "python"
_scan.bind(RecordBatch, types._CODECS, types._TS_BY_BIT, scan._reference_step)
Outcome = tuple[list[RecordBatch], tuple[type[BaseException], str, object, object] | None]


def _run(it: Iterator[RecordBatch]) -> Outcome:
    got: list[RecordBatch] = []
    try:
        for batch in it:
            got.append(batch)
    except Exception as exc:  # compared whole: class, text and the located fields
        return got, (type(exc), str(exc), getattr(exc, "position", None), getattr(exc, "offset", None))
    return got, None


def assert_same(
    buf: object, start: int = 0, end: int | None = None, verify: bool = True, skip: bool = False
) -> Outcome:
    native = _scan.Scanner(buf, start, end, verify, skip)  # type: ignore[arg-type]
    if NATIVE_ACTIVE:  # what iter_batches returns for these arguments
        assert isinstance(
            iter_batches(buf, start, verify_crc=verify, end=end, skip_crc=skip),  # type: ignore[arg-type]
            _scan.Scanner,
        )
    ref = scan._iter_batches_py(buf, start, verify_crc=verify, end=end, skip_crc=skip)  # type: ignore[arg-type]
    expected = _run(ref)
    assert _run(native) == expected
    return expected


def _segment(n: int, codec: Compression = Compression.NONE, base: int = 0) -> bytes:
    out = b""
    for i in range(n):
        specs = [
            RecordSpec(1_700_000_000_000 + j, f"k{j}".encode(), bytes(j * 31 % 700)) for j in range(i % 5 + 1)
        ]
        out += build_batch(specs, base_offset=base + 10 * i, compression=codec, partition_leader_epoch=i)
    return out


SEEDS = record_seeds()
_segments = st.lists(st.sampled_from(sorted(SEEDS)), min_size=1, max_size=6).map(
    lambda names: b"".join(SEEDS[n] for n in names)
)
_inputs = (
    _segments
    | st.sampled_from(sorted(SEEDS)).flatmap(lambda n: mutated(SEEDS[n]) | crc_fixed(SEEDS[n]))
    | _segments.flatmap(mutated)
    | st.binary(max_size=600)
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[bytes, int, int | None, bool, bool]:
    data = draw(_inputs)
    if draw(st.booleans()):  # a torn tail: the last append cut anywhere
        data = data[: draw(st.integers(0, len(data)))]
    start = draw(st.sampled_from([0, 0, 0]) | st.integers(0, len(data) + 20))
    end = draw(st.none() | st.integers(-5, len(data) + 20) | st.just(2**70))
    return data, start, end, draw(st.booleans()), draw(st.booleans())


@fuzz_settings(6)
@given(cases())
def test_native_equals_reference(case: tuple[bytes, int, int | None, bool, bool]) -> None:
    data, start, end, verify, skip = case
    assert_same(data, start, end, verify, skip)
    assert_same(bytearray(data), start, end, verify, skip)


def test_buffer_types_and_real_segments() -> None:
    seg = _segment(40, Compression.SNAPPY) + _segment(7, Compression.NONE, base=400) + SEEDS["v1-gzip"]
    batches, err = assert_same(seg)
    assert err is None and len(batches) == 48 and batches[-1].magic == 1
    assert_same(memoryview(seg))
    with tempfile.TemporaryFile() as f:
        f.write(seg)
        f.flush()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            assert_same(m)
            assert_same(m, batches[3].position, batches[9].position + 5)


def test_every_seed_and_fixture_scans_the_same() -> None:
    for name, data in SEEDS.items():
        for verify in (True, False):
            _, err = assert_same(data, verify=verify)
            assert err is None, name


def test_errors_come_from_the_reference() -> None:
    seg = bytearray(_segment(5))
    second = iter_batches(bytes(seg)).__next__().size
    seg[second + 40] ^= 1  # inside the second batch's CRC range
    got, err = assert_same(bytes(seg))
    assert len(got) == 1 and err is not None and "CRC-32C mismatch" in err[1] and err[2] == second
    got, err = assert_same(bytes(seg), verify=False)
    assert err is None and [b.crc_valid for b in got] == [True, False, True, True, True]
    assert assert_same(bytes(seg), skip=True)[1] is None


def test_other_inputs_take_the_reference() -> None:
    data = _segment(3)
    assert isinstance(iter_batches(data), _scan.Scanner) is NATIVE_ACTIVE
    assert not isinstance(iter_batches(data, -len(data)), _scan.Scanner)  # negative: the reference's own
    assert not isinstance(iter_batches(memoryview(data).cast("b")), _scan.Scanner)
    assert not isinstance(iter_batches(memoryview(data)[::2]), _scan.Scanner)


def test_mmap_may_close_while_suspended() -> None:
    with tempfile.TemporaryFile() as f:
        f.write(_segment(4))
        f.flush()
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        it = iter_batches(m)
        first = next(it)
        m.close()  # no buffer export is held between steps
        with pytest.raises(ValueError, match="closed"):
            next(it)
        assert first.base_offset == 0


def test_overflowing_last_offset_is_python_int() -> None:
    batch = bytearray(build_batch([RecordSpec(1, None, b"v")], base_offset=0))
    struct.pack_into(">q", batch, 0, 2**63 - 1)
    struct.pack_into(">i", batch, 23, 5)  # lastOffsetDelta is covered by the CRC: recompute it
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    (got,), err = assert_same(bytes(batch))
    assert err is None and got.last_offset == 2**63 + 4


# -- CRC-32C paths ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=5000), st.integers(0, 2**32 - 1), st.integers(0, 63))
def test_crc32c_paths_agree_with_the_crc32c_package(data: bytes, crc: int, cut: int) -> None:
    want = crc32c.crc32c(data, crc)
    for path in (*_scan.CRC_PATHS, "auto"):
        assert _scan.crc32c(data, crc, path) == want, path
        assert _scan.crc32c(memoryview(data)[cut:], _scan.crc32c(data[:cut], crc, path), path) == want


def test_crc32c_long_inputs() -> None:
    data = os.urandom(3 * 4096 * 3 + 4321)
    for n in (255, 256, 257, 319, 320, 4095, 12288, 12289, 40000, len(data)):
        for path in _scan.CRC_PATHS:
            assert _scan.crc32c(data[:n], 0, path) == crc32c.crc32c(data[:n]), (path, n)


# -- a segment's CRC from its verified batches (scan.batches_crc32c) ---------------------------


def _verified(data: bytes) -> list[RecordBatch]:
    return list(iter_batches(data, verify_crc=True))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 70), min_size=1, max_size=12), st.sampled_from(list(Compression)))
def test_batches_crc32c_is_the_crc_of_their_bytes(counts: list[int], codec: Compression) -> None:
    data = b"".join(_segment(n, codec, base=1000 * i) for i, n in enumerate(counts))
    batches = _verified(data)
    assert scan.batches_crc32c(data, batches) == crc32c.crc32c(data)
    if NATIVE_ACTIVE:  # combined from the headers, not read again
        assert _scan.batches_crc32c(data, batches) == crc32c.crc32c(data)
    tail = batches[len(batches) // 2 :]
    assert scan.batches_crc32c(data, tail) == crc32c.crc32c(data[tail[0].position :])


def test_batches_crc32c_of_every_real_and_seed_segment() -> None:
    # Broker-written segments (../shared/fixtures), v0/v1 message sets (CRC-32 over other bytes:
    # every byte read instead), control batches, KRaft snapshots: always the CRC of the bytes.
    for name, data in SEEDS.items():
        batches = _verified(data)
        if not batches:
            continue
        end = batches[-1].position + batches[-1].size
        assert scan.batches_crc32c(data, batches) == crc32c.crc32c(data[:end]), name
        legacy = any(b.magic < 2 for b in batches)
        assert (_scan.batches_crc32c(data, batches) is None) is legacy, name


def test_batches_crc32c_refuses_what_it_cannot_combine() -> None:
    data = _segment(6)
    batches = _verified(data)
    assert _scan.batches_crc32c(data, [batches[0], batches[2]]) is None  # not contiguous
    assert _scan.batches_crc32c(data[: batches[-1].position + 30], batches) is None  # past the buffer
    assert _scan.batches_crc32c(data, []) is None
    assert scan.batches_crc32c(data, []) == 0
    with pytest.raises(TypeError):
        _scan.batches_crc32c(data, tuple(batches))  # type: ignore[arg-type]


def test_portable_build_table_path(tmp_path: Path) -> None:
    # What a non-x86 build compiles (RLM_SCAN_PORTABLE: no intrinsics): built here, then held to
    # the crc32c package and to the reference walk like the real extension.
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler: the extension itself could not have been built"
    so = tmp_path / f"_scan{sysconfig.get_config_var('EXT_SUFFIX')}"
    src = ROOT / "rlm/formats/records/_scan.c"
    include = f"-I{sysconfig.get_paths()['include']}"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-std=c11", "-DRLM_SCAN_PORTABLE", include, str(src), "-o", str(so)],
        check=True,
        timeout=120,
    )
    spec = importlib.util.spec_from_file_location("rlm.formats.records._scan", so)
    assert spec is not None and spec.loader is not None
    portable = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(portable)
    assert portable.CRC_PATHS == ("table",)
    data = os.urandom(20_000)
    for n in (0, 1, 255, 256, 4097, 20_000):
        assert portable.crc32c(data[:n], 7) == crc32c.crc32c(data[:n], 7)
    portable.bind(RecordBatch, types._CODECS, types._TS_BY_BIT, scan._reference_step)
    seg = bytearray(_segment(12, Compression.LZ4) + SEEDS["v0-snappy"])
    seg[300] ^= 0xFF
    for verify in (True, False):
        want = _run(scan._iter_batches_py(bytes(seg), verify_crc=verify))
        assert _run(portable.Scanner(bytes(seg), 0, None, verify, False)) == want


# -- never out of bounds ---------------------------------------------------------------------

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture(scope="module")
def guarded() -> Iterator[memoryview]:
    """A page of bytes followed by a PROT_NONE page: the view ends exactly where reads must stop."""
    m = mmap.mmap(-1, 2 * _PAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert _libc.mprotect(ctypes.c_void_p(addr + _PAGE), ctypes.c_size_t(_PAGE), 0) == 0
    view = memoryview(m)[:_PAGE]
    yield view
    view.release()


@fuzz_settings(4)
@given(data=_inputs.map(lambda d: d[:_PAGE]), verify=st.booleans(), skip=st.booleans())
def test_never_reads_past_the_buffer(guarded: memoryview, data: bytes, verify: bool, skip: bool) -> None:
    tail = guarded[_PAGE - len(data) :]
    tail[:] = data
    assert_same(tail, verify=verify, skip=skip)


# -- which walk runs -------------------------------------------------------------------------

_BLOCK = (
    "import importlib.abc, sys\n"
    "class Block(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name == 'rlm.formats.records._scan': raise ImportError('blocked by the test')\n"
    "sys.meta_path.insert(0, Block())\n"
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("RLM_SCAN", "RLM_REQUIRE_NATIVE")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_extension_is_built_and_used() -> None:
    # `make install` builds it; CI's test run sets RLM_REQUIRE_NATIVE=1 so it can never fall back quietly
    assert scan.SCAN_IMPL.startswith("native") or os.environ.get("RLM_SCAN") == "python"
    out = _python("from rlm.formats.records import scan; print(scan.SCAN_IMPL)", RLM_REQUIRE_NATIVE="1")
    assert out.returncode == 0 and out.stdout.startswith("native (CRC-32C: "), out.stderr


def test_missing_extension_falls_back_with_one_line() -> None:
    code = _BLOCK + (
        "from rlm.formats.records import scan, iter_batches, build_batch, RecordSpec\n"
        "data = build_batch([RecordSpec(1, None, b'v')], base_offset=0)\n"
        "print(scan.SCAN_IMPL, len(list(iter_batches(data))))\n"
    )
    out = _python(code)
    assert out.returncode == 0 and out.stdout.split() == ["python", "1"]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "compiled extension not built" in lines[0] and "make install" in lines[0]


def test_required_extension_missing_is_an_error() -> None:
    code = _BLOCK + (
        "from rlm.errors import NativeExtensionError\n"
        "try:\n    import rlm.formats.records\n"
        "except NativeExtensionError as e:\n    print('refused:', e)\n"
    )
    for env in ({"RLM_REQUIRE_NATIVE": "1"}, {"RLM_SCAN": "native"}):
        out = _python(code, **env)
        assert out.stdout.startswith("refused: the compiled record scan"), (env, out.stderr)


def test_forced_python_and_a_bad_choice() -> None:
    out = _python(
        "from rlm.formats.records import scan; print(scan.SCAN_IMPL)",
        RLM_SCAN="python",
        RLM_REQUIRE_NATIVE="1",
    )
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "python", "")
    out = _python("import rlm.formats.records", RLM_SCAN="fast")
    assert out.returncode != 0 and "RLM_SCAN: expected python or native, got 'fast'" in out.stderr


def test_scan_crc32c_is_the_packages_natively_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    # rlm.formats.records.scan.crc32c: a whole segment's and an upload's CRC; from CRC_NOGIL_BYTES
    # (64 KiB) the compiled one runs without the GIL
    data = os.urandom((1 << 20) + 4321)
    for n in (0, 1, 65535, 65536, 65537, len(data)):
        want = crc32c.crc32c(data[:n])
        assert scan.crc32c(data[:n]) == want, n
        assert scan.crc32c(memoryview(data)[n // 3 : n], scan.crc32c(data[: n // 3])) == want, n
    monkeypatch.setattr(scan, "_native", None)  # where the extension is not built
    assert scan.crc32c(data) == crc32c.crc32c(data)
    assert scan.crc32c(data[7:], scan.crc32c(data[:7])) == crc32c.crc32c(data)
