"""Outputs of an audit: Parquet tables, ``summary.json`` and a self-contained ``report.html``.

The HTML has no script and loads nothing: its charts are inline SVG drawn here.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from notify.audit.checks import SEVERITY, AuditResult

__all__ = ["TABLES", "render_html", "summarize", "svg_bars", "write_outputs"]

#: Parquet tables written under ``--out`` (directory names)
TABLES: Final = (
    "findings",
    "transactions",
    "stuck_prepared",
    "coordinator",
    "topic_hours",
    "tx_hours",
)
MAX_FINDINGS_SHOWN: Final = 500
#: Spark jobs of the outputs submitted at once (table writes and the summary's queries)
OUTPUT_THREADS: Final = 4
PALETTE: Final = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
OUTCOME_COLORS: Final = {
    "committed": "#59a14f",
    "rolled_back": "#bab0ac",
    "prepared": "#edc948",
    "active": "#76b7b2",
    "heuristic_commit": "#b07aa1",
    "heuristic_rollback": "#e15759",
    "unknown": "#9c755f",
}

Progress = Callable[[str], None]


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _bucket_labels(kind: str, b: int) -> str:
    if kind == "size":
        if b < 0:
            return "0"
        lo, hi = 2**b, 2 ** (b + 1) - 1
        return f"{lo}" if lo == hi else f"{lo}-{hi}"
    # duration buckets: powers of 10 ms
    names = {-1: "0ms", 0: "1-9ms", 1: "10-99ms", 2: "0.1-1s", 3: "1-10s", 4: "10-100s"}
    return names.get(b, ">100s")


def _log_bucket(c: Any, base: float) -> Any:
    return F.when(c <= 0, F.lit(-1)).otherwise(
        F.floor(F.log(float(base), c.cast("double"))).cast("int")
    )


def summarize(
    result: AuditResult,
    counts: dict[str, int] | None = None,
    pool: ThreadPoolExecutor | None = None,
) -> dict[str, Any]:
    """Everything small enough for ``summary.json`` and the HTML report (a few Spark jobs,
    run at once on ``pool`` when given: each is small, and one after the other they leave
    the cores idle while the driver plans the next)."""
    counts = result.finding_counts() if counts is None else counts
    tx = result.transactions
    order = F.when(F.col("severity") == "violation", 0).otherwise(1)
    queries: dict[str, Callable[[], list[Any]]] = {
        "topic_hours": lambda: result.topic_hours.orderBy("hour_ms", "topic").collect(),
        "outcomes": lambda: (
            tx.groupBy("outcome")
            .agg(
                F.count("*").alias("transactions"),
                F.sum("messages").alias("messages"),
                F.sum("bytes").alias("bytes"),
                F.percentile_approx("messages", [0.5, 0.9, 0.99]).alias("msg_p"),
                F.max("messages").alias("msg_max"),
                F.percentile_approx("duration_ms", [0.5, 0.9, 0.99]).alias("dur_p"),
                F.max("duration_ms").alias("dur_max"),
                F.percentile_approx("in_doubt_ms", [0.5, 0.99]).alias("doubt_p"),
            )
            .collect()
        ),
        "hist": lambda: (
            tx.select(F.lit("size").alias("h"), _log_bucket(F.col("messages"), 2).alias("b"))
            .unionByName(
                tx.filter(F.col("duration_ms").isNotNull()).select(
                    F.lit("duration").alias("h"), _log_bucket(F.col("duration_ms"), 10).alias("b")
                )
            )
            .groupBy("h", "b")
            .count()
            .collect()
        ),
        "tx_hours": lambda: result.tx_hours.orderBy("hour_ms", "outcome").collect(),
        "shown": lambda: (
            result.findings.orderBy(order, "check", "tx_key", "msg_id")
            .limit(MAX_FINDINGS_SHOWN)
            .collect()
        ),
        "stuck": lambda: result.stuck_prepared.orderBy(F.desc("age_s")).limit(100).collect(),
    }
    if pool is None:
        got = {k: q() for k, q in queries.items()}
    else:
        futures = {k: pool.submit(q) for k, q in queries.items()}
        got = {k: f.result() for k, f in futures.items()}
    txlog_kinds = dict(result.txlog_kinds)  # counted by audit() in its counting pass
    th = got["topic_hours"]  # small; totals from it
    lg: dict[str, Any] = {
        "messages": sum(int(r["messages"]) for r in th),
        "bytes": sum(int(r["bytes"] or 0) for r in th),
        "first_ms": min((r["first_ms"] for r in th), default=None),
        "last_ms": max((r["last_ms"] for r in th), default=None),
    }
    outcomes: dict[str, dict[str, Any]] = {}
    for r in got["outcomes"]:
        outcomes[r["outcome"]] = {
            "transactions": int(r["transactions"]),
            "messages": int(r["messages"] or 0),
            "bytes": int(r["bytes"] or 0),
            "messages_p50_p90_p99": r["msg_p"],
            "messages_max": r["msg_max"],
            "duration_ms_p50_p90_p99": r["dur_p"],
            "duration_ms_max": r["dur_max"],
            "in_doubt_ms_p50_p99": r["doubt_p"],
        }
    hist_rows = got["hist"]
    hist: dict[str, list[tuple[str, int]]] = {"size": [], "duration": []}
    for r in sorted(hist_rows, key=lambda r: (r["h"], r["b"])):
        hist[r["h"]].append((_bucket_labels(r["h"], int(r["b"])), int(r["count"])))
    topic_hours = [
        {
            "topic": r["topic"],
            "hour": _iso(r["hour_ms"]),
            "messages": int(r["messages"]),
            "bytes": int(r["bytes"]),
        }
        for r in th
    ]
    tx_hours = [
        {
            "hour": _iso(r["hour_ms"]),
            "outcome": r["outcome"],
            "transactions": int(r["transactions"]),
            "messages": int(r["messages"] or 0),
        }
        for r in got["tx_hours"]
    ]
    shown = [{k: r[k] for k in r.asDict()} for r in got["shown"]]
    stuck = [
        {
            "tx_key": r["tx_key"],
            "age_s": round(float(r["age_s"]), 1),
            "prepared_at": _iso(r["prepared_at_ms"]),
            "timeout_s": r["timeout_used_s"],
            "messages": int(r["messages"]),
        }
        for r in got["stuck"]
    ]
    violations = sum(n for c, n in counts.items() if SEVERITY.get(c) == "violation")
    warnings = sum(n for c, n in counts.items() if SEVERITY.get(c) != "violation")
    clog = result.coordinator_log
    return {
        "ok": violations == 0,
        "violations": violations,
        "warnings": warnings,
        "findings_by_check": dict(sorted(counts.items())),
        "audited_at": _iso(result.now_ms),
        "inputs": result.inputs,
        "tx_timeout_s": result.tx_timeout_s,
        "txlog_records": txlog_kinds,
        "partition_messages": int(lg["messages"]),
        "partition_bytes": int(lg["bytes"]),
        "first_message_at": _iso(lg["first_ms"]),
        "last_message_at": _iso(lg["last_ms"]),
        "transactions": outcomes,
        "tx_size_histogram": hist["size"],
        "tx_duration_histogram": hist["duration"],
        "topic_hours": topic_hours,
        "tx_hours": tx_hours,
        "stuck_prepared": stuck,
        "coordinator": None
        if clog is None
        else {
            "path": clog.path,
            "coordinator_id": clog.coordinator_id,
            "format_id": clog.format_id,
            "complete": clog.complete,
            "decisions": len(clog.decisions),
            "heuristics": len(clog.heuristics),
        },
        "findings_shown": shown,
    }


def run_info(
    result: AuditResult, summary: dict[str, Any], run: dict[str, Any], t_out: float
) -> dict[str, Any]:
    """The run's figures: what was read (from the files, from the incremental state), by
    how many executors, how long each part took and rows per second."""
    sc = result.log.sparkSession.sparkContext
    read = result.read_stats()
    rows = sum(summary["txlog_records"].values()) + summary["partition_messages"]
    now = time.monotonic()
    started = float(run.get("started", t_out))
    audit_s = max(now - started, 1e-9)
    executors = max(0, sc._jsc.sc().getExecutorMemoryStatus().size() - 1)
    st = result.state
    return {
        "master": run.get("master", sc.master),
        "executors": executors,
        "parallelism": sc.defaultParallelism,
        "incremental": result.incremental,
        "state_runs": 0 if st is None else st.runs + 1,
        "state_ignored": None if st is None else st.why_full,
        **read,
        "rows": rows,
        "session_s": run.get("session_s"),
        "checks_s": run.get("checks_s"),
        "outputs_s": round(now - t_out, 1),
        "audit_s": round(audit_s, 1),
        "rows_per_s": round(rows / audit_s),
        "read_rows_per_s": round((read["txlog_rows_read"] + read["log_rows_read"]) / audit_s),
    }


def _write(df: DataFrame, path: Path, parts: int) -> None:
    df.coalesce(parts).write.mode("overwrite").parquet(str(path))


def write_outputs(
    result: AuditResult,
    out: str | Path,
    progress: Progress | None = None,
    counts: dict[str, int] | None = None,
    write_messages: bool = False,
    run: dict[str, Any] | None = None,
    also: Sequence[Callable[[], None]] = (),
) -> dict[str, Any]:
    """Write the Parquet tables, ``summary.json`` and ``report.html`` under ``out``; return
    the summary. ``also``: more jobs run beside the table writes (the incremental state's,
    :meth:`AuditResult.state_writes`).

    ``run``: what the caller measured (``master``, ``session_s``, ``checks_s`` and
    ``started``, its ``time.monotonic()`` once the session was up); completed here with what
    was read, the executors, the output time and the throughput (summary ``run``)."""
    say = progress or (lambda _m: None)
    t_out = time.monotonic()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = result.finding_counts() if counts is None else counts
    tables: dict[str, DataFrame | None] = {
        "findings": result.findings,
        "transactions": result.transactions,
        "stuck_prepared": result.stuck_prepared,
        "coordinator": result.coordinator,
        "topic_hours": result.topic_hours,
        "tx_hours": result.tx_hours,
    }
    if write_messages:
        tables["messages"] = result.messages
    written = [n for n, df in tables.items() if df is not None]
    say(f"writing {', '.join(written)} and summarizing")
    # independent Spark jobs, submitted at once (the scheduler runs their tasks side by side)
    with ThreadPoolExecutor(max_workers=OUTPUT_THREADS, thread_name_prefix="audit-out") as pool:
        writes = [
            pool.submit(
                _write,
                df,
                out / f"{name}.parquet",
                4 if name in ("transactions", "messages") else 1,
            )
            for name, df in tables.items()
            if df is not None
        ]
        writes += [pool.submit(job) for job in also]
        summary = summarize(result, counts, pool)
        for w in writes:
            w.result()
    summary["run"] = run_info(result, summary, run or {}, t_out)
    summary["tables"] = {n: str(out / f"{n}.parquet") for n, df in tables.items() if df is not None}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    say("rendering report.html")
    (out / "report.html").write_text(render_html(summary))
    return summary


# ---------------------------------------------------------------------------- SVG


def _fmt(v: float) -> str:
    if v >= 1e9:
        return f"{v / 1e9:.1f}G"
    if v >= 1e6:
        return f"{v / 1e6:.1f}M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:g}"


def svg_bars(
    title: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    colors: Mapping[str, str] | None = None,
    width: int = 720,
    height: int = 260,
) -> str:
    """A stacked bar chart as an inline ``<svg>``: one bar per category, one color per series."""
    esc = html.escape
    n = max(1, len(categories))
    left, right, top, bottom = 72, 12, 28, 72
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(s[i] for s in series.values()) for i in range(len(categories))]
    vmax = max(totals, default=0) or 1.0
    step = 10 ** math.floor(math.log10(vmax))
    vmax = math.ceil(vmax / step) * step
    bw = plot_w / n
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
        f'<text x="{left}" y="16" class="t">{esc(title)}</text>',
    ]
    for k in range(5):
        v = vmax * k / 4
        y = top + plot_h - plot_h * k / 4
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="g"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" class="a" text-anchor="end">{_fmt(v)}</text>'
        )
    palette = iter(PALETTE * 4)
    cmap = {name: (colors or {}).get(name) or next(palette) for name in series}
    every = max(1, math.ceil(n / 24))
    for i, cat in enumerate(categories):
        x = left + i * bw
        y = top + plot_h
        for name, vals in series.items():
            v = vals[i]
            if v <= 0:
                continue
            h = plot_h * v / vmax
            y -= h
            parts.append(
                f'<rect x="{x + bw * 0.1:.1f}" y="{y:.1f}" width="{max(1.0, bw * 0.8):.1f}" '
                f'height="{h:.1f}" fill="{cmap[name]}"><title>{esc(cat)} {esc(name)}: '
                f"{v:g}</title></rect>"
            )
        if i % every == 0:
            cx = x + bw / 2
            parts.append(
                f'<text x="{cx:.1f}" y="{top + plot_h + 12}" class="a" text-anchor="end" '
                f'transform="rotate(-35 {cx:.1f} {top + plot_h + 12})">{esc(cat)}</text>'
            )
    lx = left + 8 * len(title) + 24  # legend on the title line
    for name in series if len(series) > 1 else ():
        parts.append(
            f'<rect x="{lx}" y="7" width="10" height="10" fill="{cmap[name]}"/>'
            f'<text x="{lx + 14}" y="16" class="a">{esc(name)}</text>'
        )
        lx += 24 + 6 * len(name)
    if not categories:
        parts.append(f'<text x="{left + 8}" y="{top + 20}" class="a">no data</text>')
    parts.append("</svg>")
    return "".join(parts)


def _pivot(
    rows: list[dict[str, Any]], cat: str, series: str, value: str, top: int = 8
) -> tuple[list[str], dict[str, list[float]]]:
    cats = sorted({str(r[cat]) for r in rows})
    totals: dict[str, float] = {}
    for r in rows:
        totals[str(r[series])] = totals.get(str(r[series]), 0) + r[value]
    keep = [s for s, _ in sorted(totals.items(), key=lambda kv: -kv[1])[:top]]
    out: dict[str, list[float]] = {s: [0.0] * len(cats) for s in keep}
    idx = {c: i for i, c in enumerate(cats)}
    for r in rows:
        s = str(r[series])
        name = s if s in out else "other"
        if name not in out:
            out[name] = [0.0] * len(cats)
        out[name][idx[str(r[cat])]] += r[value]
    return [c.replace("T", " ").replace(":00:00Z", "h") for c in cats], out


_CSS: Final = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.ok{color:#1b7f3b} .bad{color:#c0392b} .warn{color:#b7791f}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td{overflow-wrap:anywhere;max-width:420px}
th{background:#f4f4f4} td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.violation td:first-child{border-left:3px solid #c0392b}
tr.warning td:first-child{border-left:3px solid #edc948}
svg{display:block;margin:8px 0} svg .t{font-size:13px;font-weight:600}
svg .a{font-size:10px;fill:#555} svg .g{stroke:#eee}
code{font-size:12px}
"""


def _table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], classes: Sequence[str] = ()
) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if i < len(classes) else ""
        cells = "".join(
            f'<td class="n">{v:,}</td>'
            if isinstance(v, int) and not isinstance(v, bool)
            else f"<td>{esc('' if v is None else str(v))}</td>"
            for v in row
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def render_html(s: dict[str, Any]) -> str:
    """The report page of a summary (see :func:`summarize`): the inputs and verdict, the
    run, the findings, the transactions, the messages and the coordinator."""
    out = _head_html(s)
    if s.get("run"):
        out += _run_html(s["run"])
    out += _findings_html(s)
    out += _transactions_html(s)
    out += _messages_html(s)
    if s.get("coordinator"):
        out += _coordinator_html(s["coordinator"])
    out.append("</body></html>\n")
    return "".join(out)


def _head_html(s: dict[str, Any]) -> list[str]:
    """The page's head, the inputs and the verdict (violations, warnings)."""
    esc = html.escape
    status = (
        '<p class="ok"><b>OK</b>: no violation found.</p>'
        if s["ok"]
        else f'<p class="bad"><b>{s["violations"]:,} violation(s)</b> found.</p>'
    )
    if s["warnings"]:
        status += f'<p class="warn">{s["warnings"]:,} warning(s).</p>'
    return [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<title>notify transaction audit</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>notify transaction audit</h1>",
        f"<p>audited at {esc(str(s['audited_at']))}; txlog <code>"
        f"{esc(str(s['inputs'].get('txlog')))}</code>, data <code>"
        f"{esc(str(s['inputs'].get('data')))}</code>"
        + (
            f", coordinator log <code>{esc(str(s['inputs'].get('coordinator_log')))}</code>"
            if s["inputs"].get("coordinator_log")
            else ""
        )
        + "</p>",
        status,
    ]


def _run_html(r: dict[str, Any]) -> list[str]:
    """The run (:func:`run_info`): where and how fast, what it parsed now and what it took
    from the state, what an incremental run checked again, why a state was not used."""
    mode = "incremental" if r["incremental"] else "full"
    out = [
        f"<p>{mode} run on <code>{html.escape(str(r['master']))}</code> "
        f"({r['executors']} executors, parallelism {r['parallelism']}): "
        f"{r['rows']:,} rows audited in {r['audit_s']} s "
        f"(<b>{r['rows_per_s']:,} rows/s</b>; checks {r['checks_s']} s, outputs "
        f"{r['outputs_s']} s).</p>",
        _table(
            ["input", "rows parsed now", "bytes parsed now", "earlier rows checked again"],
            [
                (
                    "redo log",
                    r["txlog_rows_read"],
                    r["txlog_bytes_read"],
                    r["txlog_rows_from_state"],
                ),
                ("partitions", r["log_rows_read"], r["log_bytes_read"], r["log_rows_from_state"]),
            ],
        ),
    ]
    if r.get("keys_redone") is not None:
        out.append(
            f"<p>checked again: {r['keys_redone']:,} transactions "
            f"({r['keys_changed']:,} with records added or deleted) and "
            f"{r['blocks_redone']:,} message-id blocks; the rest carried from the "
            "state.</p>"
        )
    if r.get("state_ignored"):
        out.append(f"<p class=warn>state not used: {html.escape(str(r['state_ignored']))}</p>")
    return out


def _findings_html(s: dict[str, Any]) -> list[str]:
    """Findings per check (chart and table), the first findings, the stuck transactions."""
    out = ["<h2>Findings</h2>"]
    fc = s["findings_by_check"]
    if not fc:
        out.append("<p>none.</p>")
    else:
        out.append(
            svg_bars(
                "findings per check",
                list(fc),
                {"findings": [float(v) for v in fc.values()]},
                {"findings": "#e15759"},
                height=220,
            )
        )
        out.append(
            _table(
                ["check", "severity", "findings"],
                [(c, SEVERITY.get(c, "?"), n) for c, n in fc.items()],
                [SEVERITY.get(c, "warning") for c in fc],
            )
        )
        shown = s["findings_shown"]
        out.append(
            f"<p>first {len(shown):,} findings (all of them in <code>findings.parquet</code>):</p>"
        )
        out.append(
            _table(
                ["check", "tx", "topic-partition", "offset", "msg id", "where", "detail"],
                [
                    (
                        f["check"],
                        f["tx_key"],
                        None if f["topic"] is None else f"{f['topic']}-{f['partition']}",
                        None if f["offset"] is None else str(f["offset"]),
                        None if f["msg_id"] is None else str(f["msg_id"]),
                        None
                        if f["file"] is None and f["position"] is None
                        else f"{f['file'] or ''}@{f['position']}",
                        f["detail"],
                    )
                    for f in shown
                ],
                [f["severity"] for f in shown],
            )
        )
    if s["stuck_prepared"]:
        out.append("<h2>Stuck in doubt</h2>")
        out.append(
            _table(
                ["transaction", "age (s)", "prepared at", "timeout (s)", "messages"],
                [
                    (x["tx_key"], x["age_s"], x["prepared_at"], x["timeout_s"], x["messages"])
                    for x in s["stuck_prepared"]
                ],
            )
        )
    return out


def _transactions_html(s: dict[str, Any]) -> list[str]:
    """Transactions by outcome (table), per hour, and their size and duration histograms."""
    tx = s["transactions"]
    out = [
        "<h2>Transactions</h2>",
        _table(
            [
                "outcome",
                "transactions",
                "messages",
                "bytes",
                "msgs p50/p90/p99",
                "max msgs",
                "duration ms p50/p90/p99",
                "max ms",
            ],
            [
                (
                    o,
                    v["transactions"],
                    v["messages"],
                    v["bytes"],
                    "/".join(str(x) for x in v["messages_p50_p90_p99"] or []),
                    v["messages_max"],
                    "/".join(str(x) for x in v["duration_ms_p50_p90_p99"] or []),
                    v["duration_ms_max"],
                )
                for o, v in sorted(tx.items())
            ],
        ),
    ]
    cats, series = _pivot(s["tx_hours"], "hour", "outcome", "transactions")
    out.append(svg_bars("transactions per hour by outcome", cats, series, OUTCOME_COLORS))
    for key, title in (
        ("tx_size_histogram", "transaction size (messages)"),
        ("tx_duration_histogram", "commit duration (first message to COMMIT)"),
    ):
        h = s[key]
        out.append(
            svg_bars(
                title,
                [b for b, _ in h],
                {"transactions": [float(c) for _, c in h]},
                {"transactions": "#4e79a7"},
                height=220,
            )
        )
    return out


def _messages_html(s: dict[str, Any]) -> list[str]:
    """Messages per topic and hour, the partitions' totals, the redo records by kind."""
    esc = html.escape
    cats, series = _pivot(s["topic_hours"], "hour", "topic", "messages")
    return [
        "<h2>Messages per topic and hour</h2>",
        svg_bars("messages per hour (message-id time)", cats, series),
        f"<p>{s['partition_messages']:,} messages, {s['partition_bytes']:,} bytes in the "
        f"partitions, from {esc(str(s['first_message_at']))} to "
        f"{esc(str(s['last_message_at']))}.</p>",
        _table(["redo record", "count"], sorted(s["txlog_records"].items())),
    ]


def _coordinator_html(c: dict[str, Any]) -> list[str]:
    """The coordinator log read: its id, formatId, decisions, heuristics, completeness."""
    return [
        "<h2>Coordinator</h2>",
        _table(
            ["coordinator id", "formatId", "decisions", "heuristics", "complete log"],
            [(c["coordinator_id"], c["format_id"], c["decisions"], c["heuristics"], c["complete"])],
        ),
    ]
