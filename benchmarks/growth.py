"""How time and memory grow with the scale factor: a table and a plot from bench JSON files.

Reads ``distfusion bench tpch --json`` files of the same queries at several
scale factors (the scale factor is read from the data directory's name,
``tpch-sf<N>``), and prints, per engine and scale factor, the seconds over all
queries (the sum of the medians), that time per scale-factor unit, and the
peak memory of the run: the largest ``peak_extra_bytes`` of any query (the
machine's used memory over its level when that query started,
:class:`distfusion.bench.PeakMemory`). With ``--plot``, draws both against the
scale factor, log-log, with a line of slope one through each engine's first
point: time that grows no faster than the data stays on or under it.
The plot needs matplotlib (``pip install matplotlib``), which distfusion does not.

Usage::

    python benchmarks/growth.py benchmarks/results/2026-11-26-growth-sf{1,10,30}.json \
        --plot docs/img/tpch-growth.png
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ENGINES = {
    "distfusion": "distfusion on Spark",
    "local": "distfusion local",
    "datafusion": "single-node DataFusion",
    "spark-sql": "Spark SQL",
}
"""Engine key in the bench JSON -> the name shown; in this order."""


def scale_factor(doc: dict) -> float:
    """The scale factor of a bench run, from its data directory's name (``tpch-sf10``).

    Raises:
        ValueError: the directory's name has no ``sf<number>``.
    """
    found = re.search(r"sf(\d+(?:\.\d+)?)", Path(doc["settings"]["data"]).name)
    if found is None:
        msg = f"no scale factor in the data directory's name: {doc['settings']['data']}"
        raise ValueError(msg)
    return float(found.group(1))


def growth(docs: list[dict]) -> dict[str, dict[float, tuple[float, int | None]]]:
    """Engine -> scale factor -> (seconds over all queries, peak extra bytes of the run).

    An engine is listed at a scale factor only if it ran every query of that run.
    """
    out: dict[str, dict[float, tuple[float, int | None]]] = {}
    for doc in docs:
        sf = scale_factor(doc)
        queries = doc["queries"].values()
        for engine in ENGINES:
            runs = [q["engines"].get(engine) for q in queries]
            if not runs or any(r is None for r in runs):
                continue
            peaks = [r["peak_extra_bytes"] for r in runs if r["peak_extra_bytes"] is not None]
            total = sum(r["median_s"] for r in runs)
            out.setdefault(engine, {})[sf] = (total, max(peaks) if peaks else None)
    return out


def table(data: dict[str, dict[float, tuple[float, int | None]]]) -> str:
    """A Markdown table: one row per engine and scale factor."""
    lines = [
        "| engine | scale factor | seconds, all queries | seconds per SF unit | peak extra memory |",
        "|---|---:|---:|---:|---:|",
    ]
    for engine, name in ENGINES.items():
        for sf, (total, peak) in sorted(data.get(engine, {}).items()):
            memory = f"{peak / 2**30:.1f} GiB" if peak is not None else ""
            lines.append(f"| {name} | {sf:g} | {total:.1f} | {total / sf:.2f} | {memory} |")
    return "\n".join(lines)


def plot(data: dict[str, dict[float, tuple[float, int | None]]], path: str) -> None:
    """Draw seconds and peak memory against the scale factor into the PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for engine, name in ENGINES.items():
        points = sorted(data.get(engine, {}).items())
        if not points:
            continue
        sfs = [sf for sf, _ in points]
        seconds = [total for _, (total, _) in points]
        (line,) = time_ax.plot(sfs, seconds, marker="o", label=name)
        time_ax.plot(
            sfs, [seconds[0] * sf / sfs[0] for sf in sfs], ls=":", color=line.get_color(), lw=1
        )
        peaks = [(sf, peak / 2**30) for sf, (_, peak) in points if peak is not None]
        if peaks:
            memory_ax.plot(*zip(*peaks, strict=True), marker="o", label=name)
    time_ax.set(
        xscale="log",
        yscale="log",
        xlabel="TPC-H scale factor",
        ylabel="seconds, all queries",
        title="Time (dotted: growing as the data)",
    )
    memory_ax.set(
        xscale="log",
        xlabel="TPC-H scale factor",
        ylabel="GiB",
        title="Peak extra memory of the run",
    )
    for ax in (time_ax, memory_ax):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", help="bench --json files, one per scale factor")
    p.add_argument("--plot", help="write the plot to this PNG file (needs matplotlib)")
    args = p.parse_args(argv)
    data = growth([json.loads(Path(f).read_text()) for f in args.json])
    print(table(data))
    if args.plot:
        plot(data, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
