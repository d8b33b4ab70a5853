"""The TOML configs tests and benches write for `rlm run` and the jobs: one writer for all of them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlm.testing.toml import toml_value

__all__ = ["faulty_local_options", "write_config"]


def write_config(
    path: Path,
    log_dirs: list[Path],
    *,
    root: Path | None = None,
    backend: str = "local",
    options: dict[str, Any] | None = None,
    eligibility: str = "high-watermark",
    server_port: int | None = None,
    topics: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    prefix_spread: int = 0,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
    **tiering: Any,
) -> Path:
    """A TOML config; ``tiering`` values become ``[tiering]`` keys (gc_grace_ms defaults to 0),
    ``prefix_spread`` the ``[remote]`` key (docs/key-spread.md; 0 = not written),
    ``topics`` values ``[topics]`` keys (a dict value such as ``overrides`` becomes sub-tables),
    ``cluster`` values ``[cluster]`` keys (``leaders`` becomes the ``[cluster.leaders]`` table),
    ``sections`` any further tables as ``{"kafka": {"listen": "127.0.0.1:0"}}``."""
    tiering.setdefault("gc_grace_ms", 0)

    opts = dict(options) if options is not None else {"root": str(root)}
    lines = [
        "[log]",
        f"dirs = {toml_value([str(d) for d in log_dirs])}",
        f"eligibility = {toml_value(eligibility)}",
        "[remote]",
        f"backend = {toml_value(backend)}",
    ]
    lines += [f"prefix_spread = {prefix_spread}"] if prefix_spread else []
    lines += ["[remote.options]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in opts.items()]
    lines += ["[tiering]"] + [f"{k} = {toml_value(v)}" for k, v in tiering.items()]
    sections = dict(sections or {})
    server = {**({"port": server_port} if server_port is not None else {}), **sections.pop("server", {})}
    if server:  # sections["server"] adds to the port (one [server] table)
        lines += ["[server]"] + [f"{k} = {toml_value(v)}" for k, v in server.items()]
    if topics:
        lines += ["[topics]"] + [f"{k} = {toml_value(v)}" for k, v in topics.items() if k != "overrides"]
        for pattern, table in (topics.get("overrides") or {}).items():
            lines += [f"[topics.overrides.{json.dumps(pattern)}]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    if cluster:  # docs/cluster.md; a "leaders" dict becomes [cluster.leaders]
        lines += ["[cluster]"] + [f"{k} = {toml_value(v)}" for k, v in cluster.items() if k != "leaders"]
        if "leaders" in cluster:
            lines += ["[cluster.leaders]"] + [f"{json.dumps(k)} = {v}" for k, v in cluster["leaders"].items()]
    for section, table in sections.items():
        lines += [f"[{section}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def faulty_local_options(store: Path, faults: Mapping[str, Any], seed: int = 0) -> dict[str, Any]:
    """``[remote.options]`` of the ``faulty`` backend (docs/storage.md) wrapping a ``local`` store at
    ``store``: ``faults`` are its rates/operations, ``seed`` makes the injected failures repeatable."""
    return {"inner": "local", "inner_options": {"root": str(store)}, "seed": seed, **faults}
