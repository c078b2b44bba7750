"""The one table (terminal and Markdown), the ratios, the chart and docs/peers.md."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.peers.common import (
    BATCH,
    CONSUME,
    NONE,
    STREAM,
    SYNC,
    SYNC1,
    SYNC10,
    TX1,
    TX10,
    TX_SHAPES,
    TXC1,
    TXC10,
    WINDOW,
    Result,
)

SHAPE_ORDER = [SYNC1, SYNC10, BATCH, STREAM, TX1, TX10, TXC1, TXC10, CONSUME]
DUR_ORDER = [SYNC, WINDOW, NONE]
SYSTEM_ORDER = ["notify", "RabbitMQ", "Redis always", "Redis everysec", "NATS JetStream"]


@dataclass
class RawLimits:
    fsync_per_s: float  # at the start of the run
    loopback_mb_s: float
    fsync_end_per_s: float = 0.0  # again at the end: shows whether the disk was contended


def reference(row: Result, rows: list[Result], library: bool) -> Result | None:
    """The notify row ``row`` is compared with: same durability class and shape, driven
    through notify's own client library (``library``) or by the wire-level driver; the
    fastest such row."""
    same = [
        r
        for r in rows
        if r.system == "notify"
        and r.durability == row.durability
        and r.shape == row.shape
        and r.library == library
    ]
    return max(same, key=lambda r: r.rate, default=None)


def ratio(row: Result, rows: list[Result], library: bool) -> float | None:
    if row.system == "notify":
        return None
    ref = reference(row, rows, library)
    if ref is None or row.rate <= 0:
        return None
    return ref.rate / row.rate


def ordered(rows: list[Result]) -> list[Result]:
    def key(r: Result) -> tuple[int, int, int, int, float]:
        return (
            SHAPE_ORDER.index(r.shape),
            DUR_ORDER.index(r.durability),
            SYSTEM_ORDER.index(r.system) if r.system in SYSTEM_ORDER else 99,
            0 if r.library else 1,
            -r.rate,
        )

    return sorted(rows, key=key)


def _f(v: float | None, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


HEAD = [
    "shape",
    "durability",
    "system",
    "mode",
    "msg/s",
    "tx/s",
    "p50 ms",
    "p99 ms",
    "server CPU µs/msg",
    "client CPU µs/msg",
    "notify.client x",
    "notify wire x",
]


def table_rows(rows: list[Result], raw: RawLimits) -> list[list[str]]:
    out: list[list[str]] = [
        [
            "raw limit",
            "",
            "disk",
            "100 B append + fdatasync/s (start / end)",
            f"{raw.fsync_per_s:,.0f} / {raw.fsync_end_per_s:,.0f}",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
        ],
        [
            "raw limit",
            "",
            "loopback",
            "socket copy, 1 MiB writes (MB/s)",
            f"{raw.loopback_mb_s:,.0f}",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
        ],
    ]
    for r in ordered(rows):
        lib = ratio(r, rows, True)
        wire = ratio(r, rows, False)
        mode = r.mode if r.library or r.system != "notify" else f"{r.mode} [wire]"
        out.append(
            [
                r.shape,
                r.durability,
                r.system,
                mode,
                f"{r.msg_rate:,.0f}",
                f"{r.tx_rate:,.0f}" if r.shape in TX_SHAPES else "",
                _f(r.pct(0.5), ".2f"),
                _f(r.pct(0.99), ".2f"),
                _f(r.cpu_us_per_msg, ".1f"),
                _f(r.client_cpu_us_per_msg, ".1f"),
                "" if lib is None else f"{lib:.2f}",
                "" if wire is None else f"{wire:.2f}",
            ]
        )
    return out


def print_table(rows: list[Result], raw: RawLimits) -> None:
    data = [HEAD, *table_rows(rows, raw)]
    widths = [max(len(row[i]) for row in data) for i in range(len(HEAD))]
    numeric = set(range(4, len(HEAD)))

    def line(row: list[str]) -> str:
        cells = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "| " + " | ".join(cells) + " |"

    print()
    print(line(HEAD))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in data[1:]:
        print(line(row))
    print()


def markdown_table(rows: list[Result], raw: RawLimits) -> str:
    lines = [
        "| " + " | ".join(HEAD) + " |",
        "|" + "|".join("---:" if i >= 4 else "---" for i in range(len(HEAD))) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(rows, raw)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- machine facts


def machine_facts() -> dict[str, str]:
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ""
    with contextlib.suppress(OSError):
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "load average (1/5/15 min) at start": load,
    }


# ---------------------------------------------------------------------------- chart


LABELS = {
    "notify": "notify (notify.client library)",
    "notify [wire]": "notify (wire-level driver)",
}
COLORS = {
    "notify": "#2b6cb0",
    "notify [wire]": "#90cdf4",
    "RabbitMQ": "#dd6b20",
    "Redis always": "#c53030",
    "Redis everysec": "#f6ad55",
    "NATS JetStream": "#38a169",
}


def write_chart(rows: list[Result], raw: RawLimits, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: list[tuple[str, str]] = []
    for r in ordered(rows):
        g = (r.shape, r.durability)
        if g not in groups:
            groups.append(g)
    series = list(COLORS)
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(groups) * 2 + 1.5))
    ypos = 0.0
    yticks: list[float] = []
    ylabels: list[str] = []
    used: set[str] = set()
    for shape, dur in groups:
        members = [r for r in rows if (r.shape, r.durability) == (shape, dur)]
        best: dict[str, Result] = {}
        for r in members:
            name = r.system if r.library or r.system != "notify" else "notify [wire]"
            if name not in best or r.rate > best[name].rate:
                best[name] = r
        names = [s for s in series if s in best]
        h = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            r = best[name]
            y = ypos + i * h
            ax.barh(
                y,
                r.rate,
                height=h,
                color=COLORS[name],
                label=LABELS.get(name, name) if name not in used else None,
            )
            used.add(name)
            ax.text(r.rate * 1.05, y, f"{r.rate:,.0f}", va="center", fontsize=7)
        yticks.append(ypos + 0.4 - h / 2)
        unit = "tx/s" if shape in TX_SHAPES else "msg/s"
        ylabels.append(f"{shape}\n{dur} ({unit})")
        ypos += 1.2
    ax.axvline(raw.fsync_per_s, color="grey", linestyle="--", linewidth=1)
    ax.text(raw.fsync_per_s, ypos - 0.3, " raw append+fdatasync/s", color="grey", fontsize=7)
    ax.set_xscale("log")
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("rate (log scale): msg/s, or tx/s for transaction rows")
    ax.set_title("notify vs RabbitMQ, Redis Streams, NATS JetStream (100 B messages, 127.0.0.1)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- docs/peers.md

#: A ratio under this counts as "notify is behind"; between it and 1 is within the noise.
BEHIND = 0.9

#: Why a peer can be ahead of notify at the broker level (wire ratio < 1), per shape; used
#: only for the rows where it happened in the run being written up.
REASONS: dict[str, str] = {
    SYNC1: "One message per fsync: every system waits for the disk here, and notify's Python "
    "request path (parse, append, reply, ~0.1-0.3 ms of CPU) adds to the same fdatasync "
    "latency that Redis' C loop and RabbitMQ's Erlang VM wrap in less.",
    SYNC10: "Ten clients share fsyncs in every system; what is left is CPU per message, where "
    "the native servers spend less (server CPU column) on a 2-core machine that also runs the "
    "load generators.",
    BATCH: "A batch is one read, 100 native appends and one fsync in Redis; 100 separate puts "
    "cost notify ~10 µs of Python each (its mput row sends the batch as one frame).",
    TX1: "A one-message transaction is three requests for notify (BEGIN, put, COMMIT), two "
    "redo-log records (the message, the COMMIT) forced by an fsync, then an append to the "
    "partition; MULTI/EXEC and tx.commit write the message once and fsync once. With one "
    "client nothing is shared, so the extra steps show directly.",
    TX10: "notify writes every message twice (redo log before the commit, partition after it) "
    "and handles each put as a separate request; the peers write each message once.",
    TXC1: "With ten clients the fsyncs are shared in every system; notify still does two "
    "writes and three requests per one-message transaction in Python.",
    TXC10: "notify writes every message twice (redo log, then partition) in Python; Redis "
    "executes MULTI/EXEC in C with one AOF write.",
    CONSUME: "The peer serves from memory; notify reads segment files and its client decodes "
    "and CRC-checks every record in Python.",
}


def _reason(r: Result) -> str:
    return REASONS.get(
        r.shape, "The peer's server is native code (C / Erlang), notify's broker is Python."
    )


def write_markdown(
    rows: list[Result],
    raw: RawLimits,
    path: Path,
    facts: dict[str, str],
    versions: dict[str, str],
    peaks: dict[str, int],
    seconds: float,
    quick: bool,
) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    peer_rows = [r for r in ordered(rows) if r.system != "notify"]

    def worst(r: Result) -> float | None:
        vals = [v for v in (ratio(r, rows, True), ratio(r, rows, False)) if v is not None]
        return min(vals) if vals else None

    behind = [r for r in peer_rows if (w := worst(r)) is not None and w < BEHIND]
    compared = [r for r in peer_rows if worst(r) is not None]
    lines = [
        "# notify against real peers: RabbitMQ, Redis Streams and NATS JetStream",
        "",
        f"Generated by `.venv/bin/python bench/peers.py{' --quick' if quick else ''}` on {now}"
        f" ({seconds:.0f} s run). Setup: `bash scripts/peers.sh install`.",
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in facts.items()],
        *[f"- {k}: {v}" for k, v in versions.items()],
        f"- raw limits measured in this run: {raw.fsync_per_s:,.0f} appends+fdatasync/s "
        f"(100 B) at the start, {raw.fsync_end_per_s:,.0f} at the end; loopback "
        f"{raw.loopback_mb_s:,.0f} MB/s",
        *(
            [
                "- **the disk was contended during this run** (this machine type does "
                "5,000-6,000 appends+fdatasync/s when idle): the fsync-bound rows are low for "
                "every system alike, and their ratios carry more noise than usual."
            ]
            if min(raw.fsync_per_s, raw.fsync_end_per_s or raw.fsync_per_s) < 2500
            else []
        ),
        "- peak RSS (VmHWM) of the servers during the run: "
        + ", ".join(f"{k} {v / 1024:.0f} MiB" for k, v in peaks.items()),
        "",
        "## How it was measured",
        "",
        "- Every server runs on 127.0.0.1 with its data in a temp dir on the same disk as the "
        "raw fsync test; load generators run in one Python process (uvloop) on the same "
        "2-core machine, so client CPU competes with the server.",
        "- Messages are 100 bytes. Each row runs for a fixed time (count-bounded for the "
        "notify stream rows). Latency is per operation: one message, one batch or one "
        "transaction, from write to the acknowledgement.",
        "- Peers are driven through their usual Python clients (pika's asyncio adapter, "
        "redis-py's asyncio API, nats-py). notify is driven twice: through its own client library "
        "(`notify.client`, rows without a mark) and by a wire-level driver that writes frames "
        "from a tight loop (`[wire]`): that shows the broker's ceiling, not what a library "
        "user gets.",
        "- **Durability classes.** *fsync before ack*: RabbitMQ publisher confirms and AMQP "
        "transactions on persistent messages in a durable queue, Redis `appendfsync always`, "
        "notify `unflushThreshold=1` or `0` (group commit) and local transactions with "
        "`flushTxLogAtCommit=1`. *loss window*: Redis `appendfsync everysec` (up to ~1-2 s "
        "lost), notify's default flush (fsync every 1000 messages or 10 s: at these rates "
        "well under a second of data) and `flushTxLogAtCommit=2` (once a second), NATS "
        "JetStream 2.9 file storage (acknowledged once written to the OS; 2.9 has no fsync "
        "per ack). RabbitMQ has no row in this class; NATS has no transactions.",
        "- **notify.client x** and **notify wire x** = notify's rate / the peer's rate, same "
        "durability class and same shape; the reference is notify's fastest row driven "
        "through `notify.client` (library against library: the fair comparison) or by the "
        "wire driver (the broker's ceiling). Above 1: notify is faster.",
        "- CPU columns: server CPU (all threads, from /proc) and load-generator CPU per "
        "message. A high client figure means the rate measures the Python client library "
        "more than the server.",
        "",
        "## Results",
        "",
        markdown_table(rows, raw),
        "",
        "![peers chart](peers.png)",
        "",
        "## Where notify is not ahead",
        "",
    ]
    if not behind:
        lines.append(
            "In this run notify was ahead in every row with a peer at equal "
            "durability, through its client library and at the wire level."
        )
    else:
        lines.append(
            f"Of {len(compared)} peer rows with a notify row at equal durability, notify was "
            f"behind in {len(behind)} by at least one of the two ratios (a ratio under {BEHIND}; "
            "closer than that is within this machine's noise):"
        )
        lines.append("")
        for r in behind:
            lib, wire = ratio(r, rows, True), ratio(r, rows, False)
            if wire is not None and wire < BEHIND:
                how = f"behind even at the wire level ({wire:.2f}x"
                how += f", {lib:.2f}x through notify.client)" if lib is not None else ")"
                why = _reason(r)
            else:
                assert lib is not None
                how = f"behind through notify.client ({lib:.2f}x)"
                if wire is not None:
                    level = "ahead" if wire >= 1.0 else "level (within the noise)"
                    how += f" but {level} at the wire level ({wire:.2f}x)"
                why = (
                    "The difference is client-side: notify.client spends more CPU per "
                    "message than the wire driver (see the client CPU column)."
                )
            lines.append(f"- **{r.system}, {r.mode}, {r.shape}** ({r.durability}): {how}. {why}")
    lines += [
        "",
        "## Caveats",
        "",
        "- One machine, one run, a shared 2-core VM: differences under ~20 % are noise.",
        "- RabbitMQ classic queue defaults (3.10); no lazy queues, no quorum queues (those "
        "replicate and would be slower still on one node).",
        "- Redis keeps the whole stream in memory; its durability is the AOF only. notify "
        "and RabbitMQ keep messages on disk and serve them from there.",
        "- notify's consumer commits offsets (client-side, every 5 s) instead of acking "
        "each message; the consume rows compare the cost of reading, not the same protocol.",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
