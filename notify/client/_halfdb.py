"""Half messages whose local transaction is a database transaction the producer runs itself,
and whose check-back needs no hand-written checker.

::

    producer = session.create_transactional_producer("shop", db=engine)
    with producer.half_message("orders", b"paid 7", key="7") as conn:   # PREPARE sent
        conn.execute(update(accounts).where(accounts.c.id == 7).values(paid=True))
    # exit: PREPARE acknowledged, the rows and the half message's marker committed
    # together (the message's outcome is decided: COMMIT), COMMIT written to the broker;
    # an exception rolls back both

The order of events: BEGIN, the put and PREPARE are written (replies not awaited) and a
connection of ``engine`` begins a transaction with the half message's marker pending
(:class:`notify.outbox.HalfMarkers`); the block runs on that connection (its PREPARE's
fsync at the broker overlaps the block's database work). On a normal exit the producer
waits for PREPARE's acknowledgement (not prepared: the database transaction rolls back
and the error is raised), commits the database transaction (the marker rides in the
COMMIT's round trip on PostgreSQL), then writes COMMIT_TWO_PHASE and returns without
waiting for its reply: the committed marker already decides the message, the broker
answers (and makes the message readable) once the COMMIT is durable, and a COMMIT that is
lost is settled by the check-back from the marker. ``producer.flush()`` (and ``close``)
waits for the COMMITs written so far. An exception in the block rolls back the database
transaction and the message (the ROLLBACK is awaited). A message that cannot be sent at
all (no route, no connection) fails the block when it ends: the database transaction
is rolled back and the error raised.

If the producer dies, or the database's commit fails without saying whether it committed,
the broker checks back: any live producer of the group answers from the marker table
(:meth:`notify.outbox.HalfMarkers.check`): a committed marker is COMMIT; none is ROLLBACK,
after a tombstone that makes a late commit of that transaction fail (so the answer holds);
a marker still being committed is waited for, up to a lock timeout (then UNKNOWN: the
broker asks again later). Markers are kept ``HalfMarkers.retention_s`` (7 days by default)
and removed by the group's producers as they go.

The blocking API hands work to the session's loop thread twice per message, neither time
through a task: on entry the message's frames are written by a queued call (the calling
thread goes on to its database work at once), and the replies' own callbacks resolve the
future the block's end waits on; COMMIT is a queued call again, not waited for.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from notify.errors import ClientError

from ._halfmsg import Drafted, HalfHost, HalfMessage
from ._loopthread import LoopThread, ThreadFuture, _wait
from ._message import Draft

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection

    from notify.outbox.half import AsyncMarkedTransaction, HalfMarkers, MarkedTransaction

log = logging.getLogger("notify.client")


class DbHalfMessageBlock:
    """``with producer.half_message(...) as conn:`` for a producer made with ``db=``
    (blocking API): the database work runs on the calling thread, the broker's on the
    session's loop thread (see the module docstring)."""

    def __init__(
        self,
        host: HalfHost,
        msg: Draft,
        timeout: float | None,
        lt: LoopThread,
        markers: HalfMarkers,
    ):
        self._host = host
        self._msg = msg
        self._timeout = timeout
        self._lt = lt
        self.markers = markers
        self.tx: MarkedTransaction | None = None
        #: the half message once PREPARE is acknowledged; the error when it is not
        self._prepared: ThreadFuture[HalfMessage] = ThreadFuture()

    def __enter__(self) -> Connection:
        host = self._host
        d = HalfMessage.draft(host, self._msg)  # bad arguments raise here, nothing sent
        key = host.next_tx_key()
        self._lt.post(lambda: _start(host, d, self._timeout, key, self._prepared), self._prepared)
        try:
            self.tx = self.markers.begin(key)
        except BaseException:
            self._lt.run(_abandon(self._prepared))
            raise
        return self.tx.conn

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        tx = self.tx
        assert tx is not None
        if exc_type is not None:
            try:
                tx.rollback()
            finally:
                self._lt.run(_abandon(self._prepared))
            return
        try:
            half = _wait(self._prepared, None)
        except BaseException:
            tx.rollback()
            raise
        tx.commit()  # raises: the message stays prepared, the check-back decides
        self.markers.tidy()
        try:
            self._lt.post(lambda: _commit_later(self._host, half), ThreadFuture())
        except ClientError as e:  # the session closed meanwhile: decided all the same
            log.warning("half message %s: COMMIT not written (%s): check-back", half.tx_key, e)


class AsyncDbHalfMessageBlock:
    """``async with producer.half_message(...) as conn:`` for a producer made with
    ``db=`` (asyncio API). ``db`` an ``AsyncEngine``: ``conn`` is an ``AsyncConnection``
    of it, opened, committed and rolled back awaited; a blocking engine: a ``Connection``
    (the block's database calls, and the commit here, run on the loop)."""

    def __init__(self, host: HalfHost, msg: Draft, timeout: float | None, markers: HalfMarkers):
        self._host = host
        self._msg = msg
        self._timeout = timeout
        self.markers = markers
        self.half: HalfMessage | None = None
        self.tx: MarkedTransaction | None = None
        self.atx: AsyncMarkedTransaction | None = None  # on an AsyncEngine

    async def __aenter__(self) -> Connection | AsyncConnection:
        half = self.half = await HalfMessage.send(self._host, self._msg, self._timeout)
        try:
            if self.markers.async_engine is not None:
                self.atx = await self.markers.begin_async(half.tx_key)
                return self.atx.conn
            self.tx = self.markers.begin(half.tx_key)
        except BaseException:
            await half.close(True)
            raise
        return self.tx.conn

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        half = self.half
        assert half is not None
        if exc_type is not None:
            try:
                await self._end(False)
            finally:
                await half.close(True)
            return
        try:
            await half.prepared()
        except BaseException:
            await self._end(False)
            raise
        await self._end(True)  # raises: the message stays prepared, the check-back decides
        self.markers.tidy()
        _commit_later(self._host, half)

    async def _end(self, commit: bool) -> None:
        """Commit or roll back the block's database transaction (awaited on an
        AsyncEngine)."""
        atx, tx = self.atx, self.tx
        if atx is not None:
            await (atx.commit() if commit else atx.rollback())
            return
        assert tx is not None
        if commit:
            tx.commit()
        else:
            tx.rollback()


def _start(
    host: HalfHost, d: Drafted, timeout: float | None, key: str, out: ThreadFuture[HalfMessage]
) -> None:
    """On the loop: write the half message's frames and resolve ``out`` once PREPARE is
    settled (through a task only when its route or connection must be waited for)."""
    half = HalfMessage.send_now(host, d, timeout, key)
    if half is not None:
        _resolve_when_prepared(half, out)
        return

    async def waiting() -> None:
        try:
            late = await HalfMessage.send_drafted(host, d, timeout, key)
        except BaseException as e:  # handed to the waiting block
            out.set_exception(e)
            return
        _resolve_when_prepared(late, out)

    host.spawn(waiting())


def _resolve_when_prepared(half: HalfMessage, out: ThreadFuture[HalfMessage]) -> None:
    def done(err: Exception | None) -> None:
        if err is None:
            out.set_result(half)
        else:
            out.set_exception(err)

    half.on_prepared(done)


def _commit_later(host: HalfHost, half: HalfMessage) -> None:
    """On the loop: write COMMIT_TWO_PHASE, its reply tracked by the producer (a failure
    is logged: the check-back commits the message from its marker)."""
    try:
        fut = half.finish_later(True)
    except Exception:
        log.exception("half message %s: COMMIT not written: left to check-back", half.tx_key)
        return
    if fut is not None:
        host.track_second_phase(fut)


async def _abandon(prepared: ThreadFuture[HalfMessage]) -> None:
    """The block failed: roll the message back once PREPARE is settled (nothing to do
    when it was not prepared)."""
    try:
        half = await asyncio.wrap_future(prepared)
    except Exception as e:  # not prepared: nothing at the broker to end
        log.info("half message not prepared: %s", e)
        return
    await half.finish(False)
