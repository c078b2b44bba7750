"""Small typed configuration objects of the client, defaults as named constants."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from notify.client.transport import DEFAULT_HEARTBEAT_S, SECRET_ENV, TransportOptions

#: Default fetch window (MetaQ's consumer ``maxSize``).
DEFAULT_MAX_SIZE_BYTES = 1 << 20
#: Upper bound the fetch window may grow to when a record does not fit the window.
DEFAULT_MAX_FETCH_BYTES = 64 << 20
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 3.0
DEFAULT_RECONNECT_BACKOFF_MIN_S = 0.05
DEFAULT_RECONNECT_BACKOFF_MAX_S = 2.0
DEFAULT_SEND_RETRIES = 3
DEFAULT_SEND_RETRY_BACKOFF_S = 0.1
DEFAULT_BATCH_MAX_COUNT = 1000
DEFAULT_BATCH_MAX_BYTES = 512 * 1024
DEFAULT_COMMIT_INTERVAL_S = 5.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_RETRY_DELAY_S = 0.05
DEFAULT_RETRY_DELAY_MAX_S = 2.0
DEFAULT_RECOVER_INTERVAL_S = 300.0
DEFAULT_MAX_RECOVER_ATTEMPTS = 3
DEFAULT_DEDUP_WINDOW = 10_000
DEFAULT_IDLE_BACKOFF_MIN_S = 0.01
DEFAULT_IDLE_BACKOFF_MAX_S = 0.2
DEFAULT_METADATA_TTL_S = 60.0
DEFAULT_SPOOL_REPLAY_INTERVAL_S = 1.0
DEFAULT_LISTENER_THREADS = 4
#: Long-poll wait of a fetch (ms): the broker holds a get until data arrives (0: plain polling).
DEFAULT_LONG_POLL_MS = 1000
DEFAULT_CHECK_THREADS = 4
#: Cluster mode (configserver).
DEFAULT_ASSIGNMENT = "contiguous"
DEFAULT_REBALANCE_RETRY_MAX_S = 2.0
DEFAULT_ZK_SESSION_TIMEOUT_S = 30.0
DEFAULT_ZK_CONNECT_TIMEOUT_S = 10.0
#: Largest offset (int64 max): the ``offset`` command answers it with the partition's end.
MAX_OFFSET = 9223372036854775807


#: Environment variable naming the consumers' default ``data_dir``.
DATA_DIR_ENV = "NOTIFY_CLIENT_DIR"
#: The default ``data_dir`` of releases before it was made explicit (relative to the cwd).
LEGACY_DATA_DIR = Path(".notify-client")


def default_data_dir() -> Path:
    """Where a consumer keeps offsets, recover store and dead letters unless told:
    ``$NOTIFY_CLIENT_DIR``, else ``$XDG_STATE_HOME/notify-client`` (by default
    ``~/.local/state/notify-client``); an absolute path, whatever the working directory."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser().absolute()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return (Path(state).expanduser() / "notify-client").absolute()


@dataclass(slots=True)
class ClientConfig:
    """Connection settings shared by all producers and consumers of one session factory."""

    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    reconnect_backoff_min_s: float = DEFAULT_RECONNECT_BACKOFF_MIN_S
    reconnect_backoff_max_s: float = DEFAULT_RECONNECT_BACKOFF_MAX_S
    #: How long a topic's partition list is cached before ``stats topics`` is asked again.
    metadata_ttl_s: float = DEFAULT_METADATA_TTL_S
    #: Use uvloop for the background event loop of the synchronous API when installed.
    use_uvloop: bool = True
    #: Cluster mode (``zk=``): ZooKeeper session timeout; a crashed consumer's partitions
    #: move to the others after about this long (MetaQ's zkSessionTimeoutMs, 30 s).
    zk_session_timeout_s: float = DEFAULT_ZK_SESSION_TIMEOUT_S
    #: Cluster mode: how long ``connect(zk=...)`` waits for ZooKeeper.
    zk_connect_timeout_s: float = DEFAULT_ZK_CONNECT_TIMEOUT_S
    #: The brokers' shared secret (``authSecret``), sent with ``auth`` first on every
    #: connection; defaults to the ``NOTIFY_SECRET`` environment variable (unset: none).
    secret: str | None = field(default_factory=lambda: os.environ.get(SECRET_ENV) or None)
    #: TLS to the brokers: on when ``tls`` is set or a CA / client certificate file is given.
    tls: bool = False
    #: CA certificates (PEM) to trust for the brokers' certificates (None: the system store).
    tls_ca_file: str | None = None
    #: Check the broker's certificate and host name (False only for testing).
    tls_verify: bool = True
    #: Client certificate (PEM) and its key, for brokers that ask for one.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: Keep-alive: a connection with no request for this long sends ``version`` (never
    #: silent for more than twice this; brokers close connections silent for ``idleTimeout``,
    #: 300 s by default, so keep it below half of that). 0 = none.
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_S

    def transport_options(self) -> TransportOptions:
        """The :class:`~notify.client.transport.TransportOptions` of these settings (builds the TLS
        context; raises :class:`~notify.client.transport.TLSError` on unreadable files)."""
        return TransportOptions.build(
            self.secret,
            tls=self.tls,
            tls_ca_file=self.tls_ca_file,
            tls_verify=self.tls_verify,
            tls_cert_file=self.tls_cert_file,
            tls_key_file=self.tls_key_file,
            connect_timeout_s=self.connect_timeout_s,
            heartbeat_s=self.heartbeat_interval_s,
        )


@dataclass(slots=True)
class ProducerConfig:
    """Producer settings.

    ``ordered``: at most one batch in flight per partition, and when a partition stays
    unavailable after ``retries`` the message goes to an on-disk spool under ``spool_dir``
    which is replayed, in order, when the partition comes back (MetaQ's
    OrderedMessageProducer).

    ``producer_group`` makes the producer transactional in the Notify sense: its own
    connections ``register`` the group, so it may send half messages
    (``send_in_transaction``) and answers the broker's check-backs with its checker, run on
    ``check_threads`` threads. Prefer ``session.create_transactional_producer(group, checker)``
    (it takes the checker and registers with the brokers at once; a producer made with
    ``create_producer`` and this field registers as it first uses a broker, has no checker
    and so leaves every check-back UNKNOWN).
    """

    retries: int = DEFAULT_SEND_RETRIES
    retry_backoff_s: float = DEFAULT_SEND_RETRY_BACKOFF_S
    batch_max_count: int = DEFAULT_BATCH_MAX_COUNT
    batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES
    #: Batches in flight per partition (1 keeps order even across retries).
    max_in_flight_per_partition: int = 1
    #: Use the ``mput`` extension for batches (falls back to pipelined ``put`` on 400).
    use_mput: bool = True
    #: Send a checksum with every ``put`` (7-token form).
    send_checksum: bool = True
    #: Write a local transaction's COMMIT right behind its puts (``msgs=<n>``, a notify
    #: extension): one round trip per transaction. False: wait for the puts' acks first.
    pipeline_commit: bool = True
    ordered: bool = False
    spool_dir: Path | None = None
    spool_replay_interval_s: float = DEFAULT_SPOOL_REPLAY_INTERVAL_S
    producer_group: str | None = None
    #: The group's secret when the broker protects it (``[producerGroup=NAME] secret``);
    #: sent with ``register`` (use TLS, or it travels in cleartext).
    producer_group_secret: str = ""
    #: Threads running the transaction checker (check-backs answered concurrently at most).
    check_threads: int = DEFAULT_CHECK_THREADS
    #: Idempotent producer: a producer id and per-partition sequence numbers travel with
    #: every plain send, and the broker drops a retried put it already stored (a lost ack,
    #: a 503 after the write) and answers with the stored message's ack; one batch in
    #: flight per partition. Not for transactions or delayed sends. Needs notify brokers.
    idempotent: bool = False
    #: Idempotent producer with a named identity (the protocol reference): instances that
    #: take over from each other share ``producer_name`` and ``producer_secret`` (16-256
    #: printable ASCII characters, not guessable); the newest ``producer_epoch`` (default:
    #: the instance's start in microseconds) fences the older ones, and sequences go on
    #: where the broker says the identity stopped. None: an anonymous identity per instance.
    producer_name: str | None = None
    producer_secret: str | None = None
    producer_epoch: int | None = None
    #: A failed send raises its error (from ``send()``, the future of ``send_future()`` /
    #: ``send_nowait()``, ``send_batch()``, a transaction's sends). False: it returns
    #: ``SendResult(success=False, error=...)`` instead (check ``success`` or call
    #: ``raise_for_error()``). Programming errors always raise; :meth:`post` failures are
    #: counted, never raised.
    raise_on_error: bool = True
    #: Failed :meth:`~notify.client.AsyncProducer.post` messages kept for
    #: ``post_failures()`` (the oldest are dropped past it; ``posts_failed`` counts all).
    max_post_failures: int = 10_000


@dataclass(slots=True)
class ConsumerConfig:
    """Consumer settings.

    ``data_dir`` holds the local offset file (unless another ``OffsetStore`` is given to the
    consumer), the recover store and the dead letters; default :func:`default_data_dir`
    (``$NOTIFY_CLIENT_DIR`` or ``~/.local/state/notify-client``). The consumer logs where
    its offsets go when it is created.
    """

    group: str
    data_dir: Path = field(default_factory=default_data_dir)
    #: Where to start when no offset is stored: "earliest" or "latest".
    initial_offset: str = "earliest"
    commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S
    max_retries: int = DEFAULT_MAX_RETRIES
    retry_delay_s: float = DEFAULT_RETRY_DELAY_S
    retry_delay_max_s: float = DEFAULT_RETRY_DELAY_MAX_S
    #: Per-message listener timeout; a listener running longer counts as a failure.
    listener_timeout_s: float | None = 30.0
    listener_threads: int = DEFAULT_LISTENER_THREADS
    recover_interval_s: float = DEFAULT_RECOVER_INTERVAL_S
    max_recover_attempts: int = DEFAULT_MAX_RECOVER_ATTEMPTS
    #: Message ids remembered to drop redelivered duplicates: at least the last this many
    #: (two generations of this size, so at most about twice as many); 0 turns it off.
    dedup_window: int = DEFAULT_DEDUP_WINDOW
    max_fetch_bytes: int = DEFAULT_MAX_FETCH_BYTES
    idle_backoff_min_s: float = DEFAULT_IDLE_BACKOFF_MIN_S
    idle_backoff_max_s: float = DEFAULT_IDLE_BACKOFF_MAX_S
    #: > 0: long-poll ``get`` (8-token form) holding the fetch up to this many ms.
    long_poll_ms: int = DEFAULT_LONG_POLL_MS
    #: Broadcast: this instance is its own group ``<group>-<instance_id>``, offsets local.
    broadcast: bool = False
    #: Stable id of this instance (broadcast); None: read or create ``<data_dir>/<group>.instance``.
    instance_id: str | None = None
    #: Static share of the partitions (index, count): used without a cluster (no ``zk=``).
    member_index: int = 0
    member_count: int = 1
    #: Cluster mode (``connect(zk=...)``): how the group splits partitions, ``contiguous``
    #: (MetaQ's default) or ``consistent_hash``.
    assignment: str = DEFAULT_ASSIGNMENT
    #: Cluster mode: this member's id in ``consumers/<group>/ids`` (None: MetaQ's
    #: ``<group>_<host>-<pid>-<millis>-<n>``).
    consumer_id: str | None = None
    #: Cluster mode: longest wait between attempts to claim a partition another member
    #: still owns (its owner node going away also wakes the claim at once).
    rebalance_retry_max_s: float = DEFAULT_REBALANCE_RETRY_MAX_S
