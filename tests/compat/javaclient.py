"""The MetaQ 1.4 Java client's wire behaviour, re-stated in Python for tests.

Written from reading ``metamorphosis-commons`` (``network/*Command.encode``,
``MetamorphosisWireFormatType.MetaCodecFactory``, ``utils/MessageUtils``) and
``metamorphosis-client`` (``SimpleMessageProducer``, ``TransactionContext``,
``consumer/FetchRequest``) plus the gecko remoting library's read loop; nothing here is
their code, only what it puts on the wire and how it reads what comes back:

* every request ends with the opaque; ``put`` always carries the CRC32 (masked to 31 bits)
  of the payload, ``-1`` as partition when the producer has a server URL instead of
  ZooKeeper, and the transaction key as an 8th token inside a transaction;
* ``transaction`` puts ``<timeout>`` only when it is > 0 and ``<uniqueQualifier>`` only when
  it is not blank, in that order;
* ``stats`` with no item is ``stats  <opaque>`` (two spaces), ``version <opaque>``;
* a reply is read into a buffer that starts at 32 KiB and grows by 32 KiB up to
  ``MAX_READ_BUFFER_SIZE`` (2 MiB); a frame that does not fit then is never read (the
  connection stalls), and ``MessageUtils.decodeMessage`` refuses a record whose length field
  exceeds 2 MiB;
* a consumer whose window holds no whole record doubles ``maxSize`` unless it is already
  above 2 MiB.
"""

from __future__ import annotations

import socket
import struct
import zlib
from dataclasses import dataclass

MAX_READ_BUFFER_SIZE = 2 * 1024 * 1024
READ_BUFFER_START = 32 * 1024
READ_BUFFER_STEP = 32 * 1024
HEADER_LEN = 20
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
RANDOM_PARTITION = -1


def checksum(data: bytes) -> int:
    """``CheckSum.crc32``: CRC32 masked to a non-negative int."""
    return zlib.crc32(data) & 0x7FFFFFFF


def encode_payload(data: bytes, attribute: str | None) -> bytes:
    """``MessageUtils.encodePayload``: ``int attrLen + attribute + data`` when there is an
    attribute, else the data alone; the flag's bit 0 says which."""
    if attribute is None:
        return data
    attr = attribute.encode("utf-8")
    return struct.pack(">i", len(attr)) + attr + data


def flag_of(attribute: str | None) -> int:
    return 1 if attribute is not None else 0


# --------------------------------------------------------------------------- requests


def put(
    topic: str,
    partition: int,
    data: bytes,
    flag: int,
    opaque: int,
    tx_key: str | None = None,
    crc: int | None = None,
) -> bytes:
    """``PutCommand.encode`` as ``SimpleMessageProducer`` builds it (checksum always set)."""
    c = checksum(data) if crc is None else crc
    tx = f" {tx_key}" if tx_key is not None else ""
    return f"put {topic} {partition} {len(data)} {flag} {c}{tx} {opaque}\r\n".encode() + data


def get(topic: str, group: str, partition: int, offset: int, max_size: int, opaque: int) -> bytes:
    return f"get {topic} {group} {partition} {offset} {max_size} {opaque}\r\n".encode()


def offset(topic: str, group: str, partition: int, off: int, opaque: int) -> bytes:
    return f"offset {topic} {group} {partition} {off} {opaque}\r\n".encode()


def transaction(
    key: str, session: str, ttype: str, opaque: int, timeout: int = 0, uq: str | None = None
) -> bytes:
    """``TransactionCommand.encode``: the four shapes."""
    toks = ["transaction", key, session, ttype]
    if timeout > 0:
        toks.append(str(timeout))
    if uq is not None and uq.strip():
        toks.append(uq)
    toks.append(str(opaque))
    return (" ".join(toks) + "\r\n").encode()


def stats(item: str | None, opaque: int) -> bytes:
    """``StatsCommand.encode``: a blank item leaves an empty token (two spaces)."""
    if item is None or not item.strip():
        return f"stats  {opaque}\r\n".encode()
    return f"stats {item} {opaque}\r\n".encode()


def version(opaque: int) -> bytes:
    return f"version {opaque}\r\n".encode()


def sync(
    topic: str,
    partition: int,
    data: bytes,
    flag: int,
    msg_id: int,
    opaque: int,
    old_master: bool = False,
) -> bytes:
    """``SyncCommand.encode`` (1.4.4+: with checksum); ``old_master``: the 7-token form of
    masters before 1.4.4, which the slave's decoder still accepts (checksum -1)."""
    c = "" if old_master else f" {checksum(data)}"
    head = f"sync {topic} {partition} {len(data)} {flag} {msg_id}{c} {opaque}\r\n"
    return head.encode() + data


def xid_key(format_id: int, gtrid: bytes, bqual: bytes, uq: str) -> str:
    """``XATransactionId.getTransactionKey``."""
    return f"XID:{format_id}:{gtrid.hex()}:{bqual.hex()}:{uq}"


#: ``SimpleXAMessageProducer``'s default unique qualifier: prefix + "-" + host name.
DEFAULT_UQ = "XAMessageProducer-" + socket.gethostname()


# --------------------------------------------------------------------------- replies


@dataclass
class BooleanCommand:
    """``result <code> <len> <opaque>``: ``message`` is None for an empty body."""

    code: int
    message: str | None
    opaque: int


@dataclass
class DataCommand:
    """``value <len> <opaque>`` + raw records."""

    data: bytes
    opaque: int


Reply = BooleanCommand | DataCommand


class ReadBufferStalled(AssertionError):
    """The reply frame is larger than the Java client's read buffer can ever grow."""


class CodecError(AssertionError):
    """What ``MetaCodecFactory``'s decoder would throw on (the connection is closed)."""


class JavaConnection:
    """A blocking connection that reads replies the way the Java client does."""

    def __init__(self, addr: str, timeout: float = 10.0):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buf = bytearray()
        self.capacity = READ_BUFFER_START
        self.largest_frame = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> JavaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def call(self, frame: bytes) -> Reply:
        self.send(frame)
        return self.read()

    def read(self) -> Reply:
        while True:
            reply = self._decode()
            if reply is not None:
                return reply
            if len(self.buf) >= self.capacity:
                if self.capacity >= MAX_READ_BUFFER_SIZE:
                    raise ReadBufferStalled(
                        f"frame does not fit the {self.capacity}-byte read buffer "
                        f"(header {bytes(self.buf[:60])!r})"
                    )
                self.capacity += READ_BUFFER_STEP
            data = self.sock.recv(self.capacity - len(self.buf))
            if not data:
                raise ConnectionError("closed by the broker")
            self.buf += data

    def _decode(self) -> Reply | None:
        eol = self.buf.find(b"\r\n")
        if eol < 0:
            return None
        line = bytes(self.buf[:eol]).decode("utf-8")
        sa = line.split(" ")
        start = eol + 2
        try:
            if sa[0] == "result":
                n = int(sa[2])
                if len(self.buf) - start < n:
                    return None
                body = bytes(self.buf[start : start + n])
                reply: Reply = BooleanCommand(
                    int(sa[1]), body.decode("utf-8") if n else None, int(sa[3])
                )
            elif sa[0] == "value":
                n = int(sa[1])
                if len(self.buf) - start < n:
                    return None
                reply = DataCommand(bytes(self.buf[start : start + n]), int(sa[2]))
            else:
                raise CodecError(f"Unknow command:{line}")
        except (IndexError, ValueError) as e:
            raise CodecError(f"cannot decode {line!r}: {e}") from None
        self.largest_frame = max(self.largest_frame, start + n)
        del self.buf[: start + n]
        return reply


@dataclass
class JavaMessage:
    offset: int
    msg_id: int
    flag: int
    attribute: str | None
    payload: bytes


def decode_messages(data: bytes, base: int = 0) -> list[JavaMessage]:
    """``MessageIterator`` + ``MessageUtils.decodeMessage``: whole records only, checksum
    checked, a length field above ``MAX_READ_BUFFER_SIZE`` refused."""
    out: list[JavaMessage] = []
    pos = 0
    while len(data) - pos >= HEADER_LEN:
        length, crc, msg_id, flag = struct.unpack_from(">iiqi", data, pos)
        if len(data) - pos - HEADER_LEN < length:
            break
        payload = data[pos + HEADER_LEN : pos + HEADER_LEN + length]
        if checksum(payload) != crc:
            raise CodecError(f"Invalid message at {base + pos}: checksum")
        if length > MAX_READ_BUFFER_SIZE:
            raise CodecError(f"Too much long payload length:{length}")
        attribute = None
        if flag & 1:
            (alen,) = struct.unpack_from(">i", payload, 0)
            attribute = payload[4 : 4 + alen].decode("utf-8")
            payload = payload[4 + alen :]
        out.append(JavaMessage(base + pos, msg_id, flag, attribute, payload))
        pos += HEADER_LEN + length
    return out


def next_max_size(max_size: int) -> int:
    """``FetchRequest.increaseMaxSize``: double, unless already above 2 MiB."""
    return max_size if max_size > MAX_READ_BUFFER_SIZE else 2 * max_size
