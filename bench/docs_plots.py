"""Plots of the documentation's benchmark data: ``docs/benchmarks/data/*.csv`` in,
``docs/benchmarks/img/*.png`` out (committed; run again after adding a run to the data).

    .venv/bin/python bench/docs_plots.py          # needs matplotlib (the bench extra)

Every figure on the Benchmarks page is a row of those CSV files; the plots are drawn from the
same rows, so a new run is one line of data and one run of this script.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "benchmarks" / "data"
IMG = ROOT / "docs" / "benchmarks" / "img"
Row = dict[str, str]


def rows(name: str) -> list[Row]:
    with (DATA / name).open(newline="") as f:
        return list(csv.DictReader(f))


def runs() -> dict[str, Row]:
    return {r["run"]: r for r in rows("runs.csv")}


def label(run: Row) -> str:
    parts = [run["date"][5:]]
    if run["time_utc"]:
        parts.append(run["time_utc"])
    if run["commit"]:
        parts.append(run["commit"])
    return "\n".join(parts)


def finish(fig: plt.Figure, ax: Axes, name: str, title: str, xlabel: str = "",
           ylabel: str = "") -> Path:
    """Label, title and legend, then :func:`save`."""
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save(fig, name)


def log2_ticks(ax: Axes, xs: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(x) for x in xs])


def save(fig: plt.Figure, name: str) -> Path:
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / name
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def _ranges(ax: Axes, names: list[str], series: list[tuple[str, list[float], list[float]]],
            unit: str) -> None:
    """Horizontal bars from low to high (a dot when one value), one colour per series."""
    height = 0.8 / len(series)
    for i, (title, lows, highs) in enumerate(series):
        ys = [n + i * height - 0.4 + height / 2 for n in range(len(names))]
        widths = [max(h - lo, 0.0) for lo, h in zip(lows, highs, strict=True)]
        ax.barh(ys, widths, left=lows, height=height * 0.9, label=title)
        ax.plot(highs, ys, "|", color="black", markersize=6)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(unit + " (log scale; bars span the runs' range)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(series), fontsize=8)


def audit() -> Path:
    meta = runs()
    data = rows("audit.csv")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(data))
    width = 0.27
    for i, (col, title) in enumerate(
        (("full_s", "full audit"), ("first90_s", "first 90% (writes the state)"),
         ("incremental_s", "incremental (+10%)"))
    ):
        vals = [float(r[col]) if r[col] else 0.0 for r in data]
        ax.bar([x + (i - 1) * width for x in xs], vals, width, label=title)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([label(meta[r["run"]]) for r in data], fontsize=8)
    ax.axhline(90, color="grey", linestyle=":", linewidth=1)
    ax.text(len(data) - 0.5, 92, "90 s", color="grey", ha="right", fontsize=8)
    return finish(fig, ax, "audit-history.png",
                  "Spark audit of 1,000,000 transactions (8.2M rows, 1.08 GB), local[2]",
                  ylabel="seconds (lower is better)")


def queues() -> Path:
    data = rows("queues.csv")
    consumers = [int(r["consumers"]) for r in data]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for col, title in (("wire", "wire driver, batched pushes"), ("batch", "client batch_listener"),
                       ("client", "client per-message listener"),
                       ("slow1ms", "per-message, 1 ms of work each")):
        ax.plot(consumers, [float(r[col]) for r in data], marker="o", label=title)
    log2_ticks(ax, consumers)
    ax.set_yscale("log")
    return finish(fig, ax, "queues.png",
                  "Queue group, 100 B messages, 4 partitions, accepts fsynced (loaded machine)",
                  "consumers", "messages/s delivered and accepted (log)")


def partitions() -> Path:
    data = rows("partitions.csv")
    parts = [int(r["partitions"]) for r in data]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, title in (("put", "pipelined put"), ("group_commit", "group commit (fsync per ack)")):
        lo = [float(r[f"{key}_low"]) for r in data]
        hi = [float(r[f"{key}_high"]) for r in data]
        mid = [(a + b) / 2 for a, b in zip(lo, hi, strict=True)]
        err = [[m - a for m, a in zip(mid, lo, strict=True)],
               [b - m for m, b in zip(mid, hi, strict=True)]]
        ax.errorbar(parts, mid, yerr=err, marker="o", capsize=4, label=title)
    log2_ticks(ax, parts)
    return finish(fig, ax, "partitions.png", "One broker, 200k x 100 B round robin",
                  "partitions of the topic", "messages/s")


def before_after(name: str, png: str, title: str) -> Path:
    meta = runs()
    data = rows(name)
    order = list(dict.fromkeys(r["run"] for r in data))
    names = list(dict.fromkeys(r["scenario"] for r in data))
    series = []
    for run in order:
        by = {r["scenario"]: r for r in data if r["run"] == run}
        tag = "before" if run.endswith("before") else "after"
        commit = meta[run]["commit"] or "the change"
        lows = [float(by[n]["low"]) for n in names]
        highs = [float(by[n]["high"]) for n in names]
        series.append((f"{tag}: {commit} ({meta[run]['date']})", lows, highs))
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(names) + 1.8))
    _ranges(ax, names, series, data[0]["unit"])
    ax.set_title(title)
    return save(fig, png)


def broker() -> Path:
    data = rows("broker.csv")
    names = [r["scenario"] for r in data if r["run"].endswith("quiet") and r["unit"] == "msg/s"]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(names) + 1.8))
    height = 0.4
    for i, run in enumerate(("broker-2026-11-22-quiet", "broker-2026-11-22-loaded")):
        by = {r["scenario"]: float(r["value"]) for r in data if r["run"] == run}
        ys = [n + (i - 0.5) * height for n in range(len(names))]
        ax.barh(ys, [by[n] for n in names], height * 0.9,
                label="quiet (load ~1)" if i == 0 else "loaded (load 3-10)")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    return finish(fig, ax, "broker.png",
                  "Broker throughput through the wire protocol, 100 B unless noted",
                  "messages/s (log)")


def failover() -> Path:
    data = rows("failover.csv")
    fig, ax = plt.subplots(figsize=(7, 3.8))
    seeds = [f"seed {r['seed']}\n{r['rounds']} rounds" for r in data]
    xs = range(len(data))
    ax.bar([x - 0.2 for x in xs], [float(r["p50_s"]) for r in data], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [float(r["p99_s"]) for r in data], 0.4, label="p99")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(seeds, fontsize=8)
    return finish(fig, ax, "failover.png",
                  "Automatic failover, 2 s ZooKeeper sessions (0 acknowledged writes lost)",
                  ylabel="seconds from kill -9 to the next ack")


PLOTS: dict[str, Callable[[], Path]] = {
    "audit": audit,
    "queues": queues,
    "partitions": partitions,
    "client": lambda: before_after(
        "client.csv", "client.png",
        "Client library, one producer or consumer, 100 B (loaded machine)",
    ),
    "tx-client": lambda: before_after(
        "tx-client.csv", "tx-client.png",
        "Transactions through the client, flushTxLogAtCommit=2 (loaded machine)",
    ),
    "broker": broker,
    "failover": failover,
}


def main(argv: list[str]) -> int:
    for name in argv or PLOTS:
        print(f"wrote {PLOTS[name]().relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
