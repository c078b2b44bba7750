"""Connections from this broker to another one (master <-> slave), on the client transport
(:mod:`notify.client.transport`): pipelined requests, replies matched by opaque, TLS when a
context is given.

Every link opens with the replica handshake ``auth <replicationSecret> <brokerId>``: the
secret proves the peer belongs to the replication set, and both sides check the broker id
(a slave has its master's ``brokerId``, as in MetaQ): the answering broker refuses a link
naming another id, and the link refuses a peer that answers with another id or that grants
no replica role at all (it has no ``replicationSecret``).

With automatic failover both sides also name their failover epoch (the fencing token kept in
ZooKeeper, :mod:`notify.replication.failover`): each refuses a peer in an older epoch, so a
slave never replicates from, and never takes pushes from, a master that was replaced."""

from __future__ import annotations

import ssl

from notify.client.transport import AsyncConnection, TransportOptions, open_connection
from notify.errors import NotifyError
from notify.protocol.frames import encode_replica_auth
from notify.protocol.replies import parse_replica_ack, parse_replica_epoch

#: A replication link is a plain transport connection.
BrokerLink = AsyncConnection

CONNECT_TIMEOUT_S = 3.0


class ReplicaHandshakeError(NotifyError):
    """The peer is not the broker this link must reach, or refused to treat it as a replica
    (wrong or missing ``replicationSecret``, another broker id). Retried: configs change."""

    retriable = True


async def connect_link(
    addr: str,
    secret: str,
    broker_id: int,
    tls: ssl.SSLContext | None = None,
    epoch: int = 0,
) -> AsyncConnection:
    """Open a replica link to the broker at ``addr`` that must be broker ``broker_id``;
    with ``epoch`` (automatic failover) a peer in an older epoch is refused.

    Raises :class:`ReplicaHandshakeError`, :class:`~notify.errors.ConnectionLostError` or
    :class:`~notify.client.transport.TLSError` (all :class:`~notify.errors.NotifyError`)."""
    conn = await open_connection(addr, TransportOptions(None, tls, CONNECT_TIMEOUT_S))
    try:
        r = await conn.request(
            lambda o: encode_replica_auth(secret, broker_id, o, epoch), CONNECT_TIMEOUT_S
        )
    except NotifyError:
        conn.abort()
        raise
    peer = parse_replica_ack(r.body) if r.code == 200 else None
    peer_epoch = parse_replica_epoch(r.body) if r.code == 200 else 0
    if peer == broker_id and epoch and peer_epoch < epoch:
        conn.abort()
        raise ReplicaHandshakeError(
            f"replication peer {addr} is in failover epoch {peer_epoch}, older than this "
            f"broker's {epoch}: refused (it was replaced)"
        )
    if peer != broker_id:
        conn.abort()
        text = r.body[:200].decode("utf-8", "replace")
        if r.code != 200:
            why = f"refused the replica handshake ({r.code} {text})"
        elif peer is None:
            why = f"granted no replica role ({text!r}): set the same replicationSecret on it"
        else:
            why = f"is broker {peer}, not broker {broker_id}"
        raise ReplicaHandshakeError(f"replication peer {addr} {why}")
    return conn
