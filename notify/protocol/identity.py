"""Idempotent producers' identities and the ``producer`` verb that claims one (notify
extension; MetaQ clients never send it, their puts carry no producer members).

A producer id names who wrote a message (``"p"`` in its properties,
:mod:`notify.protocol.properties`) and keys the broker's duplicate detection. It cannot be
borrowed: it carries the proof of a secret that never travels with the messages::

    producer id = <name> "~" <tag>
    tag         = base64url(SHA-256("notify-producer-id" NUL <name> NUL <secret>)[:16]),
                  22 characters [A-Za-z0-9_-], no padding
    <name>      = [A-Za-z0-9._-]*  (empty: an anonymous identity, ``~<tag>``)

* **Anonymous** (``ProducerConfig(idempotent=True)``): the client draws a random secret per
  producer instance; the id is new with the instance and known to no one else.
* **Named** (``ProducerConfig(idempotent=True, producer_name=..., producer_secret=...)``): a
  stable name and an application secret shared by every instance that may take it over
  (one per outbox relay shard, say). Instances are ordered by an *epoch* (by default the
  instance's start time in microseconds; a relay may pass its leader-election epoch) and
  told apart by a random *instance* token: the newest epoch holds the identity, older
  instances are fenced.

A connection must claim an identity before its puts may name it; the broker refuses any
put naming an identity its connection has not claimed (and never deduplicates it)::

    producer <producerId> <secret> <epoch> <instance> <opaque>\\r\\n

    <epoch>     0..2^63-1 (anonymous: 0)
    <instance>  [A-Za-z0-9]{1,64} (anonymous: "-")
    <secret>    16..256 printable ASCII characters, no space

Replies (``result <code> <len> <opaque>``):

* 200, body ``<producerId> <epoch> <n>`` then ``n`` lines ``<topic> <partition>
  <lastSeq>``, LF-separated: the identity is this connection's, held at ``<epoch>``; the
  lines are the last sequence the broker stored for it in each of its partitions (none:
  nothing stored yet, start at 0; else go on at ``lastSeq + 1``; a batch re-sent with
  sequences up to ``lastSeq`` is answered from what is stored);
* 400 malformed (bad id, secret, epoch or instance, an id longer than the broker's
  ``maxProducerIdLength``); 403 the id is not the one its secret proves;
* 409 ``fenced: ...``: a newer instance (higher epoch, or the same epoch with another
  instance token) holds the identity: this instance must stop (never retried);
* 503: the broker's producer state is full (``producerStateMaxBytes``) or the connection
  holds ``maxProducerIdsPerConnection`` identities (retriable later).

A put (or mput) whose records carry producer members is answered, besides its usual
replies: 403 ``producer <id> is not claimed on this connection`` and 409 ``fenced: ...``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Final

from notify.errors import ProtocolError

#: Characters of the tag that ends every producer id.
TAG_LENGTH: Final = 22
#: Separates a producer id's name from its tag.
MARK: Final = "~"
NAME: Final = re.compile(r"[A-Za-z0-9._-]*")
_TAG: Final = re.compile(r"[A-Za-z0-9_-]{22}")
SECRET: Final = re.compile(r"[!-~]{16,256}")
INSTANCE: Final = re.compile(r"[A-Za-z0-9]{1,64}")
#: the instance token of an anonymous claim
NO_INSTANCE: Final = "-"
_DOMAIN: Final = b"notify-producer-id\x00"
MAX_EPOCH: Final = 2**63 - 1


def tag_of(name: str, secret: str) -> str:
    """The tag that proves ``secret`` for ``name``."""
    digest = hashlib.sha256(_DOMAIN + name.encode() + b"\x00" + secret.encode()).digest()
    return base64.urlsafe_b64encode(digest[:16]).rstrip(b"=").decode("ascii")


def producer_id(name: str, secret: str) -> str:
    """The producer id of ``name`` (empty: anonymous) with ``secret``."""
    if not NAME.fullmatch(name):
        raise ValueError(f"a producer name is [A-Za-z0-9._-]*, not {name[:40]!r}")
    if not SECRET.fullmatch(secret):
        raise ValueError("a producer secret is 16-256 printable ASCII characters, no space")
    return f"{name}{MARK}{tag_of(name, secret)}"


def split_id(pid: str) -> tuple[str, str] | None:
    """``(name, tag)`` of a well-formed producer id, else None."""
    name, mark, tag = pid.rpartition(MARK)
    if not mark or not _TAG.fullmatch(tag) or not NAME.fullmatch(name):
        return None
    return name, tag


def proves(pid: str, secret: str) -> bool:
    """Whether ``secret`` is the one ``pid``'s tag proves (constant-time compare)."""
    parts = split_id(pid)
    if parts is None:
        return False
    return hmac.compare_digest(parts[1].encode(), tag_of(parts[0], secret).encode())


@dataclass(frozen=True, slots=True)
class Claim:
    """``producer <producerId> <secret> <epoch> <instance> <opaque>``."""

    producer_id: str
    secret: str
    epoch: int
    instance: str
    opaque: int

    @property
    def named(self) -> bool:
        return not self.producer_id.startswith(MARK)


def decode_claim(tokens: list[bytes], opaque: int) -> Claim:
    """The ``producer`` request of a header line's tokens (6); ProtocolError (400) when a
    field is malformed. The id's length against the broker's setting is the broker's."""
    if len(tokens) != 6:
        raise ProtocolError(f"producer: expected 6 tokens, got {len(tokens)}", 400, opaque)
    try:
        pid, secret, epoch_s, instance = (t.decode("ascii") for t in tokens[1:5])
    except UnicodeDecodeError:
        raise ProtocolError("producer: fields are ASCII", 400, opaque) from None
    if split_id(pid) is None:
        raise ProtocolError(
            f"producer: malformed producer id {pid[:60]!r} (<name>~<22-character tag>)",
            400,
            opaque,
        )
    if not SECRET.fullmatch(secret):
        raise ProtocolError(
            "producer: a secret is 16-256 printable ASCII characters", 400, opaque
        )
    if not epoch_s.isdigit() or len(epoch_s) > 19 or int(epoch_s) > MAX_EPOCH:
        raise ProtocolError(f"producer: epoch {epoch_s[:24]!r} is not in 0..2^63-1", 400, opaque)
    if instance != NO_INSTANCE and not INSTANCE.fullmatch(instance):
        raise ProtocolError("producer: instance is [A-Za-z0-9]{1,64} or -", 400, opaque)
    return Claim(pid, secret, int(epoch_s), instance, opaque)


def encode_claim(pid: str, secret: str, epoch: int, instance: str, opaque: int) -> bytes:
    """The ``producer`` request line."""
    return f"producer {pid} {secret} {epoch} {instance} {opaque}\r\n".encode("ascii")


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """The body of a ``producer`` 200: the identity, its epoch, and the last sequence stored
    per ``(topic, partition)``."""

    producer_id: str
    epoch: int
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)

    def encode(self) -> bytes:
        lines = [f"{self.producer_id} {self.epoch} {len(self.sequences)}"]
        lines += [f"{t} {p} {s}" for (t, p), s in sorted(self.sequences.items())]
        return "\n".join(lines).encode("ascii")

    @classmethod
    def parse(cls, body: bytes) -> ClaimReply:
        """Inverse of :meth:`encode` (ProtocolError when malformed)."""
        try:
            lines = body.decode("ascii").split("\n")
            pid, epoch, n = lines[0].split(" ")
            seqs: dict[tuple[str, int], int] = {}
            for line in lines[1:]:
                t, p, s = line.split(" ")
                seqs[(t, int(p))] = int(s)
            if len(seqs) != int(n):
                raise ValueError(f"{len(seqs)} sequences, header says {n}")
            return cls(pid, int(epoch), seqs)
        except (ValueError, UnicodeDecodeError) as e:
            raise ProtocolError(f"malformed producer reply: {e}") from None
