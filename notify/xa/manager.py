"""The transaction manager: participant registry, transactions, decision log, recovery job.

::

    tm = TransactionManager(CoordinatorConfig(log_dir="var/xa", coordinator_id="shop"))
    tm.register("orders_db", lambda: PostgresParticipant(dsn))
    tm.register("broker", lambda: BrokerParticipant("127.0.0.1:8123"))
    tm.start()                                  # recovery now, then every interval
    with tm.transaction(timeout=30) as tx:
        conn = tx.enlist("orders_db")
        conn.execute("INSERT ...")
        tx.enlist("broker").send("orders", b"...")
    tm.close()

Recovery runs once in :meth:`TransactionManager.start` and then on an APScheduler
``BackgroundScheduler`` every ``recovery_interval_s`` (which also checkpoints the log).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from apscheduler.schedulers.background import BackgroundScheduler

from notify.errors import ConfigError, TransactionError
from notify.txlog import TxLogConfig
from notify.xa import records as rec
from notify.xa.admin import InDoubt, list_in_doubt
from notify.xa.decisionlog import DEFAULT_CHECKPOINT_BYTES, DecisionLog
from notify.xa.errors import HeuristicError, XAError
from notify.xa.ids import Scope, XidFactory
from notify.xa.participant import ParticipantFactory
from notify.xa.pool import ParticipantPool
from notify.xa.recovery import RecoveryReport, recover_once
from notify.xa.states import TERMINAL
from notify.xa.transaction import Transaction

log = logging.getLogger("notify.xa")

DEFAULT_TIMEOUT_S: Final = 60.0
DEFAULT_RECOVERY_INTERVAL_S: Final = 30.0
DEFAULT_RECOVERY_GRACE_S: Final = 10.0
DEFAULT_MAX_IDLE: Final = 16


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Settings of a :class:`TransactionManager`.

    ``log_dir``: the decision log directory (one process at a time).
    ``coordinator_id``: ``[A-Za-z0-9_]{1,16}``, unique among coordinators sharing resources;
    ``None`` takes the log's (a new log gets a random one). ``format_id``: XA formatId
    (``None``: the log's, default "NTXA"). ``default_timeout_s``: transactions' timeout.
    ``recovery_interval_s``: period of the background recovery (0 disables the job).
    ``recovery_grace_s``: how long after its deadline an undecided prepared branch is
    rolled back by a periodic pass. ``max_idle_per_participant``: pooled connections.
    ``checkpoint_bytes``: log growth between checkpoints. ``segment_bytes``: txlog segments.
    """

    log_dir: str | os.PathLike[str]
    coordinator_id: str | None = None
    format_id: int | None = None
    default_timeout_s: float = DEFAULT_TIMEOUT_S
    recovery_interval_s: float = DEFAULT_RECOVERY_INTERVAL_S
    recovery_grace_s: float = DEFAULT_RECOVERY_GRACE_S
    max_idle_per_participant: int = DEFAULT_MAX_IDLE
    checkpoint_bytes: int = DEFAULT_CHECKPOINT_BYTES
    segment_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(f"xa.{name}: {why} (got {getattr(self, name)!r})")

        if not self.default_timeout_s > 0:
            raise bad("default_timeout_s", "must be positive")
        if self.recovery_interval_s < 0:
            raise bad("recovery_interval_s", "must be >= 0")
        if self.recovery_grace_s < 0:
            raise bad("recovery_grace_s", "must be >= 0")
        if self.max_idle_per_participant < 0:
            raise bad("max_idle_per_participant", "must be >= 0")
        if self.checkpoint_bytes < 1:
            raise bad("checkpoint_bytes", "must be positive")


class TransactionManager:
    """A 2PC coordinator (see the module docstring). Thread-safe."""

    def __init__(self, config: CoordinatorConfig):
        self.config = config
        self.decisions = DecisionLog.open(
            Path(config.log_dir),
            config.coordinator_id,
            config.format_id,
            TxLogConfig(flush_at_commit=1, segment_bytes=config.segment_bytes),
            config.checkpoint_bytes,
        )
        self.scope: Scope = self.decisions.scope
        self.xids = XidFactory(self.scope)
        self.pool = ParticipantPool(config.max_idle_per_participant)
        self._live: dict[bytes, Transaction] = {}
        self._lock = threading.Lock()
        self._recover_lock = threading.Lock()
        self._unrecovered: set[str] = set()  # participants no pass has listed yet
        self._scheduler: BackgroundScheduler | None = None
        self._closed = False
        self.last_recovery: RecoveryReport | None = None

    @property
    def coordinator_id(self) -> str:
        """This coordinator's id (gtrid prefix and broker uniqueQualifier)."""
        return self.scope.coordinator_id

    # ------------------------------------------------------------------ participants

    def register(self, name: str, factory: ParticipantFactory) -> None:
        """Register participant ``name``: ``factory()`` makes a new connection to it.

        The coordinator calls the factory for transactions (connections are pooled) and for
        recovery, also after a restart, so it must be able to reconnect on its own.
        """
        self.pool.register(name, factory)
        with self._lock:
            self._unrecovered.add(name)

    # ------------------------------------------------------------------ lifecycle

    def start(self, recover: bool = True) -> RecoveryReport | None:
        """Run recovery once (unless ``recover=False``) and start the periodic job."""
        report = self.recover() if recover else None
        interval = self.config.recovery_interval_s
        if interval > 0 and self._scheduler is None:
            sch = BackgroundScheduler(timezone="UTC")
            sch.add_job(
                self._recovery_job,
                "interval",
                seconds=interval,
                id="xa-recovery",
                max_instances=1,
                coalesce=True,
            )
            sch.start()
            self._scheduler = sch
        return report

    def close(self) -> None:
        """Stop the job, close pooled connections, checkpoint and close the log."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        with self._recover_lock:
            self.pool.close()
            self.decisions.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ transactions

    def begin(self, timeout: float | None = None) -> Transaction:
        """Start a global transaction with ``timeout`` seconds to reach its decision."""
        timeout_s = self.config.default_timeout_s if timeout is None else float(timeout)
        if timeout_s <= 0:
            raise TransactionError(f"timeout must be positive (got {timeout})")
        deadline = time.time() + timeout_s
        gtrid = self.xids.new_gtrid(deadline)
        tx = Transaction(gtrid, deadline, self.pool, self.decisions, self.xids, self._finished)
        with self._lock:
            if self._closed:
                raise TransactionError("the transaction manager is closed")
            self._live[gtrid] = tx
        return tx

    @contextlib.contextmanager
    def transaction(self, timeout: float | None = None) -> Iterator[Transaction]:
        """``with tm.transaction() as tx``: commit on normal exit, roll back on an exception.

        Calling ``tx.commit()`` or ``tx.rollback()`` inside the block is allowed; the exit
        then does nothing more.
        """
        tx = self.begin(timeout)
        try:
            yield tx
        except BaseException:
            if tx.state not in TERMINAL:
                try:
                    tx.rollback()
                except HeuristicError:
                    raise
                except XAError as e:
                    log.warning("rollback of %s after an error failed: %s", tx, e)
            raise
        if tx.state not in TERMINAL:
            tx.commit()

    def _finished(self, tx: Transaction) -> None:
        with self._lock:
            self._live.pop(tx.gtrid, None)

    def _is_live(self, gtrid: bytes) -> bool:
        with self._lock:
            return gtrid in self._live

    @property
    def active_count(self) -> int:
        """Transactions begun and not finished in this process."""
        with self._lock:
            return len(self._live)

    # ------------------------------------------------------------------ recovery

    def recover(self) -> RecoveryReport:
        """Run one recovery pass now (see :mod:`notify.xa.recovery`)."""
        with self._recover_lock:
            with self._lock:
                first = set(self._unrecovered)
            report = recover_once(
                self.pool, self.decisions, self._is_live, first, self.config.recovery_grace_s
            )
            with self._lock:
                self._unrecovered -= first - set(report.errors)
            self.last_recovery = report
            return report

    def _recovery_job(self) -> None:
        try:
            if not self._closed:
                self.recover()
                self.decisions.checkpoint()
        except Exception:  # a scheduler job must not die: log and try next time
            log.exception("xa recovery pass failed")

    def in_doubt(self) -> list[InDoubt]:
        """Prepared or decided transactions not running in this process (for operators)."""
        return [
            d for d in list_in_doubt(self.pool, self.decisions)[0] if not self._is_live(d.gtrid)
        ]

    def heuristics(self) -> list[rec.HeuristicRecord]:
        """Heuristic reports not yet acknowledged (``notify xa forget``)."""
        return self.decisions.heuristics()

    def __repr__(self) -> str:
        return f"<TransactionManager {self.coordinator_id} {self.config.log_dir}>"
