"""The one exception hierarchy of notify (broker, clients, txlog, coordinator).

Every error raised on purpose by this distribution derives from :class:`NotifyError`.
Errors are classified by behaviour: ``retriable`` says whether the same call may succeed
if simply tried again (a busy broker, a dropped connection), as opposed to a permanent
problem in the request or the data.

Tree::

    NotifyError
    ├── ConfigError                 bad server.ini: unknown key, bad value (names the key)
    ├── ProtocolError               a frame that cannot be decoded (carries the reply code)
    │   └── FrameTooLargeError      header or body over the configured maximum
    ├── InvalidTopicError           topic name outside [A-Za-z0-9._-]{1,249}
    ├── StoreError                  the message store
    │   ├── StoreCorruptError       segment files that do not fit together
    │   ├── StoreFullError          ENOSPC / EDQUOT while appending (retriable)
    │   └── OffsetOutOfRangeError   carries the nearest valid offset (MetaQ's 301)
    ├── TxLogError                  the redo transaction log (txlog/)
    │   └── TxLogCorruptError
    ├── TransactionError            transaction state machine violations
    │   ├── notify.xa.errors.XAError            the 2PC coordinator (rollback, heuristics,
    │   │                                       participants, decision log, in doubt)
    │   └── notify.client.ClientTransactionError (also a ClientError): XA codes, timeout,
    │                                           aborted, connection lost, outcome unknown
    ├── MigrationError              notify.migrations: DatabaseUnreachable, SchemaAhead
    ├── ConfigServerError           configserver: unavailable (retriable), no node, exists
    ├── SyncReplicationError        a synchronous slave did not confirm (retriable)
    ├── ReplicaHandshakeError       a replication peer is not who it must be (retriable)
    └── ClientError                 client side
        ├── ConnectionLostError     (retriable)
        ├── RequestTimeoutError     (retriable)
        ├── BrokerError             a non-200 reply from the broker (carries code)
        ├── ListenerTimeoutError    a consumer listener ran past its timeout
        ├── OffsetStoreError        notify.offsets: unavailable (retriable), table missing,
        │                           conflict (another consumer committed; retriable)
        └── NotifyWarning           (also a UserWarning) issued with :func:`warnings.warn`
            └── SubscriptionNotStartedWarning   listeners subscribed, never started

Subsystems define their subclasses next to their code (listed above) so that each module
keeps its own vocabulary; every one of them derives from this root.

Foreign exceptions (OSError, socket errors, driver errors) are translated at the module
boundary that calls the foreign code, never allowed to leak as themselves from the public API.
"""

from __future__ import annotations


class NotifyError(Exception):
    """Root of all errors raised by notify."""

    retriable: bool = False


class ConfigError(NotifyError):
    """A configuration file or value is invalid; the message names the section and key."""


class ProtocolError(NotifyError):
    """A frame that cannot be decoded.

    ``code`` is the MetaQ reply code to send (400 for malformed input); ``fatal`` means the
    framing of the stream is lost and the connection must be closed after the reply.
    """

    def __init__(self, message: str, code: int = 400, opaque: int = 0, fatal: bool = False):
        super().__init__(message)
        self.code = code
        self.opaque = opaque
        self.fatal = fatal


class FrameTooLargeError(ProtocolError):
    """A header line or a body is larger than the configured maximum."""


class StartupError(NotifyError):
    """A broker cannot start: a port it needs is taken, or another broker holds one of its
    directories. Raised before anything was opened, written or registered."""


class DirectoryLockedError(StartupError):
    """Another broker (named in the message) holds the lock on a data directory."""


class InvalidTopicError(NotifyError):
    """A topic name that is not ``[A-Za-z0-9._-]{1,249}``."""


class StoreError(NotifyError):
    """An error of the on-disk message store."""


class StoreCorruptError(StoreError):
    """Segment files that cannot be reconciled (gap, overlap, unreadable file)."""


class StoreFullError(StoreError):
    """The disk is full; nothing partial was left behind, the append may be retried later."""

    retriable = True


class OffsetOutOfRangeError(StoreError):
    """The requested offset lies outside the partition; ``nearest`` is the offset to use."""

    def __init__(self, message: str, nearest: int):
        super().__init__(message)
        self.nearest = nearest


class TxLogError(NotifyError):
    """An error of the redo transaction log."""


class TxLogCorruptError(TxLogError):
    """A transaction log or checkpoint file that cannot be read past a point."""


class TransactionError(NotifyError):
    """A transaction operation that is not allowed in the transaction's current state."""


class ClientError(NotifyError):
    """Client-side errors."""


class ConnectionLostError(ClientError):
    """The connection to a broker failed or was closed with requests in flight."""

    retriable = True


class RequestTimeoutError(ClientError):
    """No reply arrived within the request timeout."""

    retriable = True


class BrokerError(ClientError):
    """The broker answered with a non-200 code."""

    def __init__(self, code: int, message: str):
        super().__init__(f"broker error {code}: {message}")
        self.code = code
        self.text = message
        self.retriable = code in (503, 504)


class ProducerFencedError(BrokerError):
    """409 ``fenced``: a newer instance holds this idempotent producer's named identity
    (the protocol reference); this instance must stop sending. Never retried."""


class NotifyWarning(ClientError, UserWarning):
    """Base of notify's warnings (issued with :func:`warnings.warn`, so they follow the
    application's warning filters): a call that will not do what its caller most likely
    meant, though it is not an error by itself."""


class SubscriptionNotStartedWarning(NotifyWarning):
    """A consumer was closed (or dropped) with topics subscribed with a listener, but
    ``complete_subscribe()`` (or ``run()``) was never called: nothing was consumed."""

