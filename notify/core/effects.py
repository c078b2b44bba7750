"""Effects: what the transaction engine asks its shell to do.

The engine never touches a socket or the scheduler. Each command appends effects to an
outbox (a plain list); the broker's shell (:mod:`notify.broker.transactions`) executes them
with sockets, fsyncs and timers, and the simulation (:mod:`notify.sim`) executes them with a
simulated disk and a seeded scheduler, so both run the same engine code.

==========  ===============================================================================
effect      the shell must
==========  ===============================================================================
Reply       send ``result <code> <len> <opaque>`` + body to ``owner`` now (in request order)
Defer       reserve the reply slot of ``ticket`` in ``owner``'s reply order (filled later);
            ``ticket.head``: replies to the same owner that come first, written with it (a
            one-shot transaction's BEGIN and put acks: the client waits for all of them)
Complete    the ``ticket`` reserved earlier now has its code and body: release it
Force       make the redo log durable up to ``pos`` (group commit), then call
            ``engine.forced(pos, error)``
SendCheck   send a half-message check-back frame to ``owner``
Applied     messages reached their partitions (count them; index delayed messages)
==========  ===============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from notify.txlog import Position


class Ticket:
    """A reply that will be known later (after a force, or once readers can see a commit).

    ``slot`` belongs to the shell (its place in the connection's reply queue)."""

    __slots__ = ("body", "code", "done", "head", "opaque", "owner", "slot")

    def __init__(self, owner: Any, opaque: int) -> None:
        self.owner = owner
        self.opaque = opaque
        self.code = 0
        self.body = b""
        self.done = False
        self.slot: Any = None
        #: ``(opaque, code, body)`` of replies to ``owner`` that precede this one, answered
        #: now and written together with it (None: none)
        self.head: list[tuple[int, int, bytes]] | None = None

    def set(self, code: int, body: bytes) -> None:
        self.code = code
        self.body = body
        self.done = True


@dataclass(slots=True)
class Reply:
    owner: Any
    opaque: int
    code: int
    body: bytes


@dataclass(slots=True)
class Defer:
    ticket: Ticket


@dataclass(slots=True)
class Complete:
    ticket: Ticket


@dataclass(slots=True)
class Force:
    pos: Position
    #: nobody waits for it (an answered half-message commit): the shell may let the next
    #: force cover it, or run it after a short delay
    lazy: bool = False


@dataclass(slots=True)
class SendCheck:
    owner: Any
    key: str
    topic: str
    partition: int
    records: bytes
    opaque: int


@dataclass(slots=True)
class Placement:
    """Where one partition's share of an intent went."""

    topic: str
    partition: int
    offset: int
    count: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(slots=True)
class Applied:
    """A transaction's messages reached their partitions; ``delayed`` holds ``(offset,
    bytes)`` of what went to the internal delay partition (it must be indexed)."""

    key: str
    placements: tuple[Placement, ...]
    delayed: tuple[tuple[int, bytes], ...] = ()


Effect = Reply | Defer | Complete | Force | SendCheck | Applied
