"""Automatic failover's ZooKeeper node values (pure: no I/O).

Under ``<zk.zkRoot>/failover/<brokerId>/`` (beside MetaQ's layout, which MetaQ tools never
read there):

* ``lock/``            kazoo's Lock recipe: the holder is the group's master;
* ``epoch``            ``{"epoch":E,"member":N,"address":"host:port"}``: the fencing token,
  incremented at every election, the member (slave id; a configured master's is
  ``failoverSlaveId``) that leads it and the address producers and slaves use;
* ``members/<N>``      ``{"eligible":bool,"size":bytes,"address":"host:port"}``, ephemeral,
  one per following member: whether it may take over and how much data it holds (the sum
  of its partitions' ends). The slave that gets the lock hands it on when another eligible
  member holds more, so a group of three or more elects the in-sync slave with the most data;
* ``epochs/<E>``       ``{"ends":[[topic,partition,end],...]}``: the partitions' ends of the
  new master when epoch E began. Everything below them came from the previous master; a
  member coming back from an older epoch cuts its partitions to the lowest of these ends
  over the epochs it missed (the tail it wrote that no later master ever had). With
  ``"redo":[first,fileNo,offset]`` (a slave that took over: its redo-log copy's oldest
  segment and end when the epoch began) a member coming back cuts its own redo log there
  and pulls only the rest, when it still holds every segment from ``first`` on.

Each broker also keeps ``<dataPath>/failover-epoch`` (one decimal number): the last epoch
whose master's data it holds (led or followed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = [
    "EpochInfo",
    "MemberInfo",
    "decode_ends",
    "decode_epoch",
    "decode_member",
    "decode_redo",
    "encode_ends",
    "encode_epoch",
    "encode_member",
    "epoch_node_name",
]


@dataclass(frozen=True, slots=True)
class EpochInfo:
    """The value of the ``epoch`` node."""

    epoch: int
    member: int
    address: str


def encode_epoch(info: EpochInfo) -> bytes:
    """Compact JSON, keys in a fixed order."""
    obj = {"epoch": info.epoch, "member": info.member, "address": info.address}
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_epoch(raw: bytes) -> EpochInfo:
    """Inverse of :func:`encode_epoch`; ValueError on anything else."""
    obj = json.loads(raw.decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError(f"not an epoch node value: {raw[:80]!r}")
    epoch, member, address = obj.get("epoch"), obj.get("member"), obj.get("address")
    if not (isinstance(epoch, int) and isinstance(member, int) and isinstance(address, str)):
        raise ValueError(f"not an epoch node value: {raw[:80]!r}")
    return EpochInfo(epoch, member, address)


def epoch_node_name(epoch: int) -> str:
    """``epochs/<E>`` child name: zero-padded so that names sort as numbers."""
    return f"{epoch:010d}"


def encode_ends(
    ends: list[tuple[str, int, int]],
    redo: tuple[int, int, int] | None = None,
    logs: dict[str, tuple[int, int, int]] | None = None,
) -> bytes:
    """``{"ends":[[topic,partition,end],...]}`` (and ``"redo":[first,fileNo,offset]``, and
    the same span of each other replicated log by name: ``"delaylog"``, ``"queuelog"``)."""
    obj: dict[str, object] = {"ends": [list(e) for e in sorted(ends)]}
    if redo is not None:
        obj["redo"] = list(redo)
    for name, span in sorted((logs or {}).items()):
        obj[name] = list(span)
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_redo(raw: bytes, name: str = "redo") -> tuple[int, int, int] | None:
    """The ``"redo"`` (or another log's ``name``) span of an epoch-start value: ``(first
    segment, fileNo, offset)``, or None when it was not recorded."""
    obj = json.loads(raw.decode("utf-8"))
    redo = obj.get(name) if isinstance(obj, dict) else None
    if redo is None:
        return None
    if not (isinstance(redo, list) and len(redo) == 3 and all(isinstance(x, int) for x in redo)):
        raise ValueError(f"bad epoch-start {name} {redo!r}")
    return redo[0], redo[1], redo[2]


def decode_ends(raw: bytes) -> dict[tuple[str, int], int]:
    """Inverse of :func:`encode_ends`, as ``{(topic, partition): end}``."""
    obj = json.loads(raw.decode("utf-8"))
    rows = obj.get("ends") if isinstance(obj, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"not an epoch-start value: {raw[:80]!r}")
    out: dict[tuple[str, int], int] = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3):
            raise ValueError(f"bad epoch-start row {row!r}")
        topic, part, end = row
        if not (isinstance(topic, str) and isinstance(part, int) and isinstance(end, int)):
            raise ValueError(f"bad epoch-start row {row!r}")
        out[(topic, part)] = end
    return out


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """The value of a ``members/<N>`` node."""

    eligible: bool
    size: int
    address: str


def encode_member(info: MemberInfo) -> bytes:
    """Compact JSON, keys in a fixed order."""
    obj = {"eligible": info.eligible, "size": info.size, "address": info.address}
    return json.dumps(obj, separators=(",", ":")).encode()


def decode_member(raw: bytes) -> MemberInfo:
    """Inverse of :func:`encode_member`; ValueError on anything else."""
    obj = json.loads(raw.decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError(f"not a member node value: {raw[:80]!r}")
    eligible, size, address = obj.get("eligible"), obj.get("size"), obj.get("address")
    if not (isinstance(eligible, bool) and isinstance(size, int) and isinstance(address, str)):
        raise ValueError(f"not a member node value: {raw[:80]!r}")
    return MemberInfo(eligible, size, address)
