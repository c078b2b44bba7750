"""The storage seam of the broker: :class:`FileSystem` and the real :class:`OsFileSystem`.

Defined in :mod:`txlog.fs` (the lower package, which must not import the broker) and
re-exported here: the message store (:mod:`notify.store`) and the redo logs take an
``fs: FileSystem`` argument, ``OS_FS`` by default; :mod:`notify.sim.disk` provides the
simulated disk used by the crash simulation.
"""

from notify.txlog.fs import (
    FSYNC_FAILED,
    OS_FS,
    Buf,
    FileSystem,
    OsFileSystem,
    StrPath,
    ensure_dir,
    leave_marker,
    write_file_atomically,
)

__all__ = [
    "FSYNC_FAILED",
    "OS_FS",
    "Buf",
    "FileSystem",
    "OsFileSystem",
    "StrPath",
    "ensure_dir",
    "leave_marker",
    "write_file_atomically",
]
