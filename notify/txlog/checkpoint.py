"""The ``checkpoint`` file: the last few checkpoints of a log, oldest first.

The file is a sequence of frames (see :mod:`txlog.records`) of type
:attr:`~txlog.records.RecordType.CHECKPOINT`, one per checkpoint, whose body is (big-endian)::

    u8   version   (1)
    u64  file_no   \\ position where replay must start
    u64  offset    /
    f64  created   (time.time() when the checkpoint was taken)
    ...  state     opaque caller blob, up to the log's max_record_bytes

The file is never modified in place: a new version is written to ``checkpoint.tmp``, fsynced,
renamed over ``checkpoint`` and the directory fsynced, so a crash leaves either the old or the
new file. A damaged entry (bit rot) is skipped when its length is plausible, and reading stops
at the first entry that cannot be framed; the newest intact entry wins.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from notify.errors import TxLogCorruptError
from notify.txlog.fs import OS_FS, FileSystem
from notify.txlog.position import Position
from notify.txlog.records import HEADER, CorruptReason, RecordType, decode, encode, frame_size

__all__ = [
    "CHECKPOINT_FILE",
    "Checkpoint",
    "encode_checkpoint",
    "new_checkpoint",
    "read_checkpoints",
    "remove_stale_temp",
    "write_checkpoints",
]

CHECKPOINT_FILE = "checkpoint"
_TMP_SUFFIX = ".tmp"
_BODY = struct.Struct(">BQQd")
_VERSION = 1


class Checkpoint(NamedTuple):
    """A checkpoint: replay must start at ``position``; ``state`` is the caller's snapshot."""

    position: Position
    state: bytes
    created: float


def encode_checkpoint(cp: Checkpoint, max_state_bytes: int) -> bytes:
    """One checkpoint as a framed entry of the checkpoint file."""
    body = _BODY.pack(_VERSION, cp.position.file_no, cp.position.offset, cp.created) + cp.state
    return encode(RecordType.CHECKPOINT, body, max_record_bytes=max_state_bytes + _BODY.size)


def _decode_body(body: bytes) -> Checkpoint | None:
    if len(body) < _BODY.size:
        return None
    version, file_no, offset, created = _BODY.unpack_from(body)
    if version != _VERSION:
        return None
    return Checkpoint(Position(file_no, offset), body[_BODY.size :], created)


def read_checkpoints(
    directory: Path, max_state_bytes: int, fs: FileSystem = OS_FS
) -> tuple[list[Checkpoint], int]:
    """Intact checkpoints of ``directory`` oldest first, and the number of damaged entries."""
    try:
        data = fs.read_file(directory / CHECKPOINT_FILE)
    except FileNotFoundError:
        return [], 0
    except OSError as exc:
        raise TxLogCorruptError(f"cannot read {directory / CHECKPOINT_FILE}: {exc}") from exc
    limit = max_state_bytes + _BODY.size
    found: list[Checkpoint] = []
    damaged = 0
    pos = 0
    while pos < len(data):
        result = decode(memoryview(data)[pos:], max_record_bytes=limit)
        for rec in result.records:
            cp = _decode_body(rec.body) if rec.type == RecordType.CHECKPOINT else None
            if cp is None:
                damaged += 1
            else:
                found.append(cp)
        pos += result.consumed
        if result.error is None:
            break
        damaged += 1
        size = frame_size(data, pos)
        if result.error is CorruptReason.CRC_MISMATCH and size is not None and size > HEADER:
            pos += size  # skip the damaged entry; its length field looks sane
        else:
            break
    return found, damaged


def write_checkpoints(
    directory: Path,
    checkpoints: Sequence[Checkpoint],
    max_state_bytes: int,
    fsync: Callable[[int], None],
    fsync_dir: Callable[[Path], None],
    fs: FileSystem = OS_FS,
) -> None:
    """Atomically replace the checkpoint file with ``checkpoints`` (oldest first).

    ``fsync`` syncs the temporary file's descriptor, ``fsync_dir`` the directory. Raises
    OSError; on failure the previous file is left in place.
    """
    data = b"".join(encode_checkpoint(cp, max_state_bytes) for cp in checkpoints)
    final = directory / CHECKPOINT_FILE
    tmp = directory / (CHECKPOINT_FILE + _TMP_SUFFIX)
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[fs.write(fd, view) :]
            fsync(fd)
        finally:
            fs.close(fd)
        fs.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.unlink(tmp)
        raise
    fsync_dir(directory)


def new_checkpoint(position: Position, state: bytes) -> Checkpoint:
    """A checkpoint stamped with the current wall-clock time."""
    return Checkpoint(position, bytes(state), time.time())


def remove_stale_temp(directory: Path, fs: FileSystem = OS_FS) -> None:
    """Delete a ``checkpoint.tmp`` left behind by a crash during :func:`write_checkpoints`."""
    with contextlib.suppress(FileNotFoundError):
        fs.unlink(directory / (CHECKPOINT_FILE + _TMP_SUFFIX))
