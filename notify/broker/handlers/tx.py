"""Transaction verbs: ``transaction`` and ``register``, and one-shot local transactions.

The engine (:mod:`notify.core.transactions`, run by :mod:`notify.broker.transactions`) does
the work; this module gates the verbs (a broker that takes no writes now refuses them; a
producer group with a secret is joined only with it) and spots the one-shot shape: a BEGIN
followed in the same read by puts of its transaction and its COMMIT_ONE_PHASE, handed to
the engine as one unit (one redo write).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from notify.broker.authlog import record_auth_failure
from notify.broker.connection import Connection
from notify.broker.context import BrokerContext
from notify.broker.handlers.put import PutVerbs
from notify.core.transactions import TxPut
from notify.errors import ProtocolError
from notify.protocol.frames import MultiPut, Put, Register, Request, Transaction


class TxVerbs:
    """``transaction`` and ``register``."""

    def __init__(self, ctx: BrokerContext, puts: PutVerbs) -> None:
        self.ctx = ctx
        self.puts = puts

    def transaction(self, conn: Connection, r: Transaction) -> None:
        ctx = self.ctx
        if ctx.writes_refused(conn, transaction=True):
            ctx.refuse_write(conn, r.opaque)
        elif ctx.transactions is None:
            ctx.error(conn, 500, r.opaque, "transactions are not enabled on this broker")
        else:
            ctx.transactions.handle(conn, r)

    def register(self, conn: Connection, r: Register) -> None:
        ctx = self.ctx
        if ctx.transactions is None:
            ctx.error(conn, 500, r.opaque, "transactions are not enabled on this broker")
        elif not self._group_secret_ok(r):
            record_auth_failure(conn.peer)
            ctx.error(conn, 403, r.opaque, f"register {r.group}: the group's secret is required")
        else:
            ctx.transactions.register(conn, r)

    def _group_secret_ok(self, r: Register) -> bool:
        """A group with a ``[producerGroup=NAME] secret`` is joined only with that secret
        (else any app could register as it and answer its half messages' check-backs)."""
        expected = self.ctx.config.producer_groups.get(r.group)
        if expected is None:
            return True
        return hmac.compare_digest(r.secret.encode(), expected.encode())

    def oneshot(
        self, conn: Connection, reqs: Sequence[Request | ProtocolError], at: int
    ) -> int:
        """``reqs[at]`` is a BEGIN: when it is followed, in this same read, by puts of its
        transaction and its COMMIT_ONE_PHASE, and every put would be accepted, hand the
        whole transaction to the engine as one unit (one redo write); returns the index
        after the COMMIT, or 0 to run the requests one by one (any error is theirs)."""
        ctx = self.ctx
        txm = ctx.transactions
        begin: Transaction = reqs[at]  # type: ignore[assignment]
        key = begin.tx_key
        if txm is None or key is None:
            return 0
        if (
            ctx.role != "master" or ctx.fence is not None or ctx.sync_master is not None
        ) and ctx.writes_refused(conn):
            return 0
        puts: list[TxPut] = []
        nput = nmput = 0
        j = at + 1
        n = len(reqs)
        item: TxPut | None
        while True:
            if j >= n:
                return 0
            r = reqs[j]
            kind = type(r)
            if kind is Put:
                if r.tx_key != key:  # type: ignore[union-attr]
                    return 0
                item = self.puts.tx_put(r)  # type: ignore[arg-type]
                nput += 1
            elif kind is MultiPut:
                if r.tx_key != key:  # type: ignore[union-attr]
                    return 0
                item = self.puts.tx_mput(r)  # type: ignore[arg-type]
                nmput += 1
            elif kind is Transaction and r.type == "COMMIT_ONE_PHASE":  # type: ignore[union-attr]
                break
            else:
                return 0
            if item is None:
                return 0
            puts.append(item)
            j += 1
        commit: Transaction = reqs[j]  # type: ignore[assignment]
        if not txm.oneshot(conn, begin, puts, commit):
            return 0
        st = ctx.stats
        st.cmd_put += nput
        if nmput:
            st.cmd_mput += nmput
        st.cmd_other += 1  # the COMMIT (the BEGIN was counted)
        return j + 1
