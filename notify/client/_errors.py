"""Client-only exception classes (all derive from :class:`notify.errors.ClientError`)."""

from __future__ import annotations

from notify.errors import ClientError, TransactionError


class ListenerTimeoutError(ClientError):
    """A message listener ran longer than ``ConsumerConfig.listener_timeout_s``.

    Counted as a failed delivery (retried, then handed to the recover store). The listener
    thread itself cannot be stopped and keeps its executor worker until it returns.
    """

    retriable = True


# --------------------------------------------------------------------------- transactions

# the XAException codes the broker answers with (``XAException:code=N``) are defined once,
# in notify.protocol.xa


class ClientTransactionError(TransactionError, ClientError):
    """Base of the client's transaction errors; ``tx_key`` names the transaction.

    Also raised as itself for misuse: a send after commit, a nested transaction on the same
    producer and thread, a topic without a partition on the transaction's broker.
    """

    def __init__(self, message: str, tx_key: str | None = None):
        super().__init__(message)
        self.tx_key = tx_key


class XAError(ClientTransactionError):
    """The broker refused a transaction step: ``500 XAException:code=N,msg=...``.

    ``code`` is the XA code (-4 unknown transaction, -6 protocol, -3/-7 resource errors...),
    ``text`` the broker's message, ``http`` the reply code (503: too many open transactions,
    worth retrying the whole transaction later).
    """

    def __init__(self, code: int, text: str, tx_key: str | None = None, http: int = 500):
        super().__init__(f"transaction {tx_key}: XAException code={code}: {text}", tx_key)
        self.code = code
        self.text = text
        self.http = http
        self.retriable = http == 503


class TransactionTimeoutError(XAError):
    """XA code 106 (XA_RBTIMEOUT): the transaction outlived its timeout and the broker rolled
    it back; none of its messages will ever be visible."""


class TransactionAbortedError(ClientTransactionError):
    """``commit()`` found that a send of the transaction had failed, so it rolled the
    transaction back instead; ``cause`` is the failed send's error."""

    def __init__(self, message: str, tx_key: str | None, cause: BaseException):
        super().__init__(message, tx_key)
        self.cause = cause


class TransactionConnectionError(ClientTransactionError):
    """The connection a transaction is bound to dropped before it was committed.

    The broker rolls back an unprepared local transaction whose connection drops, so none of
    its messages become visible; the client never moves a transaction to a new connection.
    Run the whole transaction again if needed.
    """


class TransactionOutcomeUnknownError(TransactionConnectionError):
    """The connection dropped (or the reply timed out) after COMMIT was sent: the broker may
    or may not have committed. Check the data before running the transaction again."""
