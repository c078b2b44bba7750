"""Where the sends of a transaction go: the backend a transaction is given when it begins.

``producer.transaction(timeout=None, db=None)`` picks the backend once, at begin, and the
transaction object the application holds (:class:`~._transaction.Transaction`,
:class:`~._transaction.AsyncTransaction`) only forwards to it:

* ``db=None`` — the broker: a local broker transaction (BEGIN, puts, COMMIT_ONE_PHASE) run
  by the client's transaction core: over the calling thread's own socket or the session's
  loop thread (blocking API: ``_directtx.DirectBackend``, ``_txloop.LoopBackend``), or on the
  caller's loop (asyncio: ``_txloop.LoopTransaction``);
* ``db=<the application's database connection>`` — the outbox: the block's sends are
  written as outbox rows in that connection's current transaction (:mod:`notify.outbox`),
  nothing goes to the broker, and the outbox relay publishes them once the application's
  transaction commits (:func:`outbox_backend` / :func:`async_outbox_backend`, see
  :mod:`._outboxtx`).

A backend is anything with the surface below. Its ``core`` is a
:class:`~.core.transaction.TxCore`: the transaction's key, its state (the client
transaction's states, changed through :mod:`.core.states`' one transition table, so every
backend reports the same statuses) and its failure; a broker backend also drives its
flights, another uses it for the state and failure alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Protocol

from ._message import Draft
from ._outboxtx import AsyncOutboxBackend, OutboxBackend
from .core.transaction import TxCore
from .core.types import SendResult


class TxInfo(Protocol):
    """What every backend tells about its transaction: its core (key, state, failure, the
    broker it is bound to)."""

    @property
    def core(self) -> TxCore[Any]: ...


class SyncBackend(TxInfo, Protocol):
    """A backend of the blocking API (any thread)."""

    def send_future(self, msg: Draft) -> concurrent.futures.Future[SendResult]: ...

    def commit(self, timeout_s: float | None) -> None: ...

    def rollback(self, timeout_s: float | None) -> None: ...


class AsyncBackend(TxInfo, Protocol):
    """A backend of the asyncio API (on the producer's loop)."""

    def send_nowait(self, msg: Draft) -> asyncio.Future[SendResult]: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...


def outbox_backend(
    db: object, key: str, session_id: str, raise_on_error: bool = True
) -> SyncBackend:
    """The blocking backend of ``transaction(db=db)`` (key ``key``): outbox rows in
    ``db``'s current transaction (:mod:`._outboxtx`)."""
    return OutboxBackend(db, key, session_id, raise_on_error)


def async_outbox_backend(
    db: object, key: str, session_id: str, raise_on_error: bool = True
) -> AsyncBackend:
    """The asyncio backend of ``transaction(db=db)``; see :func:`outbox_backend`."""
    return AsyncOutboxBackend(db, key, session_id, raise_on_error)
