"""The table of ``bench/ab_trees.sh``: each figure of the lookup, catch-up, export and Kafka benches per
side (base commit, this tree) and round, and the ratio of the means (this tree / base; for
latencies lower is better, for the rest higher)."""

from __future__ import annotations

import collections
import re
import sys

FIGURES = {
    "lookup": (
        r"^\| (local offset|remote offset, cold|remote offset, warm|remote timestamp, cold)"
        r" \| \d+ \| ([\d.]+) \|",
        " p50 ms",
    ),
    "catchup": (
        r"^\| (/records 1 MiB|stream|4 × /records 1 MiB|4 × stream)"
        r" \| \d+ \| [\d.]+ \| [\d.]+ \| \*\*([\d.]+)\*\*",
        " vs boto3",
    ),
    "kafka": (
        r"^\| (Kafka Fetch v12 loop, raw bytes|kafka-python KafkaConsumer \(records decoded\)"
        r"|aiokafka consumer \(records decoded\)) \| [\d.]+ \| [\d,]+ \| [\d.]+ \| \*\*([\d.]+)x\*\*",
        " vs HTTP stream",
    ),
    "export": (
        r"^\| (rlm_1proc|local|local_processes) \| [\d.]+ \| [\d,]+ \| [\d.]+ \| \*\*([\d.]+)\*\*",
        " vs baseline",
    ),
}


def main(path: str) -> None:
    with open(path) as f:
        text = f.read()
    parts = re.split(r"^=== round (\d+) (\w+) (\w+) \S+ load \S+\n", text, flags=re.M)
    rows: dict[tuple[str, str], dict[str, list[float]]] = collections.defaultdict(
        lambda: {"base": [], "new": []}
    )
    for i in range(1, len(parts) - 1, 4):
        _round, side, bench, body = parts[i : i + 4]
        pattern, unit = FIGURES[bench]
        for m in re.finditer(pattern, body, re.M):
            rows[(bench, m.group(1) + unit)][side].append(float(m.group(2)))
        if bench == "lookup" and (m := re.search(r"\*\*([\d,]+) requests/s", body)):
            rows[(bench, "HTTP lookups/s")][side].append(float(m.group(1).replace(",", "")))
    print("| bench | figure | base | this tree | this / base (means) |\n|---|---|---|---|---|")
    for (bench, figure), sides in rows.items():
        base, new = sides["base"], sides["new"]
        ratio = (sum(new) / len(new)) / (sum(base) / len(base)) if base and new else float("nan")
        print(
            f"| {bench} | {figure} | {', '.join(map(str, base))} | {', '.join(map(str, new))} | {ratio:.2f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1])
