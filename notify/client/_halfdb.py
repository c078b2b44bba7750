"""Half messages whose local transaction is a database transaction the producer runs itself,
and whose check-back needs no hand-written checker.

::

    producer = session.create_transactional_producer("shop", db=engine)
    with producer.half_message("orders", b"paid 7", key="7") as conn:   # PREPARE sent
        conn.execute(update(accounts).where(accounts.c.id == 7).values(paid=True))
    # exit: PREPARE acknowledged, the rows and the half message's marker committed
    # together, then COMMIT of the message; an exception rolls back both

The order of events: BEGIN, the put and PREPARE are written (replies not awaited) and a
connection of ``engine`` begins a transaction with the half message's marker pending
(:class:`notify.outbox.HalfMarkers`); the block runs on that connection (its PREPARE's
fsync at the broker overlaps the block's database work). On a normal exit the producer
waits for PREPARE's acknowledgement (not prepared: the database transaction rolls back
and the error is raised), commits the database transaction (the marker rides in the
COMMIT's round trip on PostgreSQL), then sends COMMIT_TWO_PHASE and waits for it. An
exception in the block rolls back the database transaction and the message.

If the producer dies, or the database's commit fails without saying whether it committed,
the broker checks back: any live producer of the group answers from the marker table
(:meth:`notify.outbox.HalfMarkers.check`): a committed marker is COMMIT; none is ROLLBACK,
after a tombstone that makes a late commit of that transaction fail (so the answer holds);
a marker still being committed is waited for, up to a lock timeout (then UNKNOWN: the
broker asks again later). Markers are kept ``HalfMarkers.retention_s`` (7 days by default)
and removed by the group's producers as they go.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

from ._halfmsg import HalfMessage
from ._loopthread import LoopThread

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from notify.outbox.half import HalfMarkers, MarkedTransaction

Start = Callable[[], Coroutine[Any, Any, HalfMessage]]


class _DbHalf:
    """What both APIs' blocks share: the half message, its database transaction, and the
    order of events at the block's end, written once (:meth:`_ending`), which each API
    drives with its own way of waiting for the broker."""

    def __init__(self, start: Start, markers: HalfMarkers):
        self._start = start
        self.markers = markers
        self.half: HalfMessage | None = None
        self.tx: MarkedTransaction | None = None

    def _begin(self) -> Connection:
        assert self.half is not None
        self.tx = self.markers.begin(self.half.tx_key)
        return self.tx.conn

    def _rollback_db(self) -> None:
        if self.tx is not None:
            self.tx.rollback()

    def _ending(self, failed: bool) -> Generator[Awaitable[Any], Any, None]:
        """The block's end, as the broker steps to wait for: on failure the database
        transaction rolls back, then the message; else PREPARE's acknowledgement (none:
        the database transaction rolls back, the error raised), the database commit with
        the marker (when it raises, the message stays prepared and the check-back decides
        from the marker table), then COMMIT."""
        half = self.half
        assert half is not None
        if failed:
            try:
                self._rollback_db()
            finally:
                yield half.close(True)
            return
        try:
            yield half.prepared()
        except BaseException:
            self._rollback_db()
            raise
        assert self.tx is not None
        self.tx.commit()
        self.markers.tidy()
        yield half.finish(True)


class DbHalfMessageBlock(_DbHalf):
    """``with producer.half_message(...) as conn:`` for a producer made with ``db=``
    (blocking API): the database work runs on the calling thread, the broker's on the
    session's loop thread."""

    def __init__(self, start: Start, lt: LoopThread, markers: HalfMarkers):
        super().__init__(start, markers)
        self._lt = lt

    def __enter__(self) -> Connection:
        half = self.half = self._lt.run(self._start())
        try:
            return self._begin()
        except BaseException:
            self._lt.run(half.close(True))
            raise

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        steps = self._ending(exc_type is not None)
        step = next(steps, None)
        while step is not None:
            try:
                result = self._lt.run(_awaited(step))
            except BaseException as e:
                step = _next(steps, e)
            else:
                step = _next(steps, None, result)


class AsyncDbHalfMessageBlock(_DbHalf):
    """``async with producer.half_message(...) as conn:`` for a producer made with
    ``db=`` (asyncio API; ``db`` is a blocking engine: the block's database calls, and
    the commit here, run on the loop)."""

    async def __aenter__(self) -> Connection:
        half = self.half = await self._start()
        try:
            return self._begin()
        except BaseException:
            await half.close(True)
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        steps = self._ending(exc_type is not None)
        step = next(steps, None)
        while step is not None:
            try:
                result = await step
            except BaseException as e:
                step = _next(steps, e)
            else:
                step = _next(steps, None, result)


async def _awaited(step: Awaitable[Any]) -> Any:
    return await step


def _next(
    steps: Generator[Awaitable[Any], Any, None], error: BaseException | None, result: Any = None
) -> Awaitable[Any] | None:
    """The step after the one that ended with ``result`` or raised ``error`` (None: done;
    raises what the ending raises)."""
    try:
        return steps.throw(error) if error is not None else steps.send(result)
    except StopIteration:
        return None
