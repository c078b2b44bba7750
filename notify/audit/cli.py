"""``notify audit``: run the Spark audit over a broker's logs and write its report.

Exit codes: 0 no violation, 1 at least one violation, 2 usage error (bad directory, no Spark).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from notify.audit.session import DEFAULT_MASTER, input_bytes, new_session, spark_missing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from rich.progress import Progress, TaskID

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_USAGE = 2


class _SparkProgress:
    """A rich progress line per audit step, its bar fed by Spark's running stages."""

    def __init__(self, progress: Progress, spark: SparkSession | None):
        self.progress = progress
        self.spark = spark
        self.task: TaskID | None = None
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self, message: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, total=1, completed=1)
            self.progress.stop_task(self.task)
        self.task = self.progress.add_task(message, total=None)

    def attach(self, spark: SparkSession) -> None:
        self.spark = spark
        self._thread = threading.Thread(target=self._poll, name="audit-progress", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            spark, task = self.spark, self.task
            if spark is None or task is None:
                continue
            try:
                tracker = spark.sparkContext.statusTracker()
                done = total = 0
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
            except Exception:  # the session is going away
                return
            if total:
                self.progress.update(task, total=total, completed=done)

    def close(self) -> None:
        self._stop.set()
        if self.task is not None:
            self.progress.update(self.task, total=1, completed=1)
        if self._thread is not None:
            self._thread.join(2)


@contextlib.contextmanager
def _session(
    master: str, driver_memory: str, extra: dict[str, str], size: int
) -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    spark = new_session(
        master=master, driver_memory=driver_memory, extra_conf=extra, input_bytes=size
    )
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()


@click.command("audit")
@click.option(
    "--txlog",
    "txlog",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="the broker's redo log directory (or its dataLogPath / dataPath)",
)
@click.option(
    "--data",
    "data",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="the broker's dataPath (partition directories <topic>-<n>)",
)
@click.option(
    "--coordinator-log",
    "coordinator_log",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="an XA coordinator's decision log, to compare its decisions",
)
@click.option("--master", default=None, help="Spark master URL (default local[2])")
@click.option(
    "--tx-timeout",
    "tx_timeout",
    type=float,
    default=None,
    help="seconds a transaction may stay prepared (default: its logged timeout)",
)
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False),
    help="directory for the Parquet tables, summary.json and report.html",
)
@click.option("--driver-memory", default="2g", show_default=True)
@click.option(
    "--write-messages",
    is_flag=True,
    help="also write messages.parquet (one row per transactional message; audits every "
    "file, as --full does: an incremental run matches only the messages of what changed)",
)
@click.option(
    "--full",
    is_flag=True,
    help="read every file again instead of only what was added since the last run",
)
@click.option(
    "--state",
    "state_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="incremental state directory (default: <out>/state)",
)
@click.option(
    "--conf",
    "confs",
    multiple=True,
    metavar="KEY=VALUE",
    help="extra Spark setting, e.g. spark.executor.memory=2g (repeatable)",
)
@click.option("--quiet", is_flag=True, help="no progress display")
def audit(
    txlog: str,
    data: str,
    coordinator_log: str | None,
    master: str | None,
    tx_timeout: float | None,
    out: str,
    driver_memory: str,
    write_messages: bool,
    full: bool,
    state_dir: str | None,
    confs: tuple[str, ...],
    quiet: bool,
) -> None:
    """Audit committed transactions against the partitions with Spark.

    Checks that every committed transaction's messages are in their partitions exactly once
    where APPLIED (or the COMMIT hint) says, with the logged ids and checksums; that no
    message of a rolled-back or unfinished transaction is visible; that nothing stays
    prepared past the timeout; and, with --coordinator-log, that the coordinator's decisions
    match the broker's outcomes. Exits 1 when a violation is found.

    Runs are incremental: the state beside the outputs (--state) records how far each file
    was read, and the next run parses only what was added since (same result as a full
    audit); --full reads everything again. --master spark://host:7077 runs it on a cluster
    whose executors see the broker's files at the same paths.
    """
    extra: dict[str, str] = {}
    for c in confs:
        k, eq, v = c.partition("=")
        if not eq or not k.strip():
            click.echo(f"notify audit: --conf {c!r} is not KEY=VALUE", err=True)
            sys.exit(EXIT_USAGE)
        extra[k.strip()] = v.strip()
    why = spark_missing()
    if why is not None:
        click.echo(f"notify audit: {why}", err=True)
        sys.exit(EXIT_USAGE)
    try:  # sizes the session (shuffle partitions, code generation) to the input
        size = input_bytes(txlog, data)
    except FileNotFoundError as e:
        click.echo(f"notify audit: {e}", err=True)
        sys.exit(EXIT_USAGE)
    from notify.audit.checks import SEVERITY  # pyspark at its top: only when auditing
    from notify.audit.checks import audit as run_audit
    from notify.audit.report import write_outputs

    console = Console(stderr=True)
    t0 = time.monotonic()
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
        transient=False,
    )
    summary: dict[str, Any]
    with progress:
        sp = _SparkProgress(progress, None)
        try:
            sp.step(f"starting Spark ({master or DEFAULT_MASTER})")
            with _session(master or DEFAULT_MASTER, driver_memory, extra, size) as spark:
                sp.attach(spark)
                t_session = time.monotonic()
                try:
                    result = run_audit(
                        spark,
                        txlog=txlog,
                        data=data,
                        coordinator_log=coordinator_log,
                        tx_timeout_s=tx_timeout,
                        progress=sp.step,
                        state=state_dir or str(Path(out) / "state"),
                        full=full or write_messages,
                    )
                except FileNotFoundError as e:
                    sp.close()
                    click.echo(f"notify audit: {e}", err=True)
                    sys.exit(EXIT_USAGE)
                sp.step("checking")
                counts = result.finding_counts()
                t_checks = time.monotonic()
                summary = write_outputs(
                    result,
                    out,
                    progress=sp.step,
                    counts=counts,
                    write_messages=write_messages,
                    also=result.state_writes(),
                    run={
                        "master": master or DEFAULT_MASTER,
                        "session_s": round(t_session - t0, 1),
                        "checks_s": round(t_checks - t_session, 1),
                        "started": t_session,
                    },
                )
                sp.step("saving the incremental state")
                result.save_state()
                result.unpersist()
        finally:
            sp.close()
    table = Table(title=f"notify audit: {out}")
    table.add_column("check")
    table.add_column("severity")
    table.add_column("findings", justify="right")
    for check, n in summary["findings_by_check"].items():
        table.add_row(check, SEVERITY.get(check, "?"), f"{n:,}")
    out_console = Console()
    if summary["findings_by_check"]:
        out_console.print(table)
    txs = sum(v["transactions"] for v in summary["transactions"].values())
    verdict = "OK" if summary["ok"] else f"{summary['violations']:,} violation(s)"
    out_console.print(
        f"{verdict}; {txs:,} transactions, {summary['partition_messages']:,} messages; "
        f"report {Path(out) / 'report.html'} ({time.monotonic() - t0:.1f}s)"
    )
    sys.exit(EXIT_OK if summary["ok"] else EXIT_VIOLATIONS)
