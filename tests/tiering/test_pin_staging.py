"""A sight pin a crash cut short (docs/architecture.md §5.1): rlm/tiering/copy/sight.py stages a pin
in ``pins/<base>.tmp`` and publishes the whole directory by one rename, so ``pin.json`` is written
in place, without a rename of its own. Real parts as in tests/tiering/test_pins.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rlm.formats import naming
from rlm.logdir.discovery import list_segments
from rlm.logdir.writer import LogWriter
from rlm.testing.configs import write_config
from rlm.testing.store_check import check_store
from tests.tiering.test_pins import TOPIC, SwitchableStore, _bytes_on_disk, _manager, _pinned, _produce


def test_a_pin_cut_short_before_its_rename_is_removed_never_counted_and_pinned_again(tmp_path: Path) -> None:
    """A crash while a sight pin is staged leaves ``pins/<base>.tmp``: its links, and a
    ``pin.json`` written in place (sight.py publishes the whole directory by one rename, so
    pin.json has no rename of its own) possibly torn. Such a directory is never read as a pin nor
    counted; the next pass removes it and pins the segment afresh, whole."""
    logs = tmp_path / "logs"
    writer = LogWriter(logs, TOPIC, 0, segment_bytes=1 << 20)
    _produce(writer, 3, [1_700_000_000_000])
    part = logs / f"{TOPIC}-0"
    rolled = [s.base_offset for s in list_segments(part)][:-1]
    cfg = write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store")
    store = SwitchableStore(root=str(tmp_path / "store"))
    store.down = True
    assert _manager(cfg, store).run_once(gc=False)[0].error is not None
    state = tmp_path / "logs.rlm-state"
    assert _pinned(state) == rolled
    (pins,) = state.glob("*/pins")
    whole = json.loads((pins / f"{rolled[1]:020d}" / "pin.json").read_text())
    assert whole["base_offset"] == rolled[1]

    # The crash: segment rolled[1]'s pin staged again, its pin.json torn, not yet renamed.
    shutil.rmtree(pins / f"{rolled[1]:020d}")
    staged = pins / f"{rolled[1]:020d}.tmp"
    staged.mkdir()
    os.link(part / naming.segment_file_name(rolled[1], naming.LOG), staged / "segment.log")
    (staged / "pin.json").write_text(json.dumps(whole)[:17])

    manager = _manager(cfg, store)
    label = {"log_dir": str(logs)}
    assert manager.run_once(gc=False)[0].error is not None  # the store is still down
    assert not staged.exists() and _pinned(state) == rolled
    assert json.loads((pins / f"{rolled[1]:020d}" / "pin.json").read_text())["base_offset"] == rolled[1]
    registry = manager.shared.metrics.registry
    assert registry.get_sample_value("rlm_pinned_segments", label) == len(rolled)
    assert registry.get_sample_value("rlm_pinned_bytes", label) == _bytes_on_disk(state)

    store.down = False
    assert [r.error for r in manager.run_once(gc=False)] == [None]
    assert sorted(check_store([logs], store).remote_bases(f"{TOPIC}-0")) == rolled
    assert _pinned(state) == [] and registry.get_sample_value("rlm_pinned_segments", label) == 0
    writer.close()
