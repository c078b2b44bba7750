"""Which build of :mod:`notify.protocol.hotpath` the hot loops use.

``scripts/build_native.py`` (run by ``scripts/setup.sh``) compiles a copy of ``hotpath.py``
with mypyc into ``notify/protocol/_hotpath_native*.so``, with the SHA-256 of the source it
was built from baked in as ``SOURCE_SHA256``. At import this module hashes ``hotpath.py``
as it is now and uses the compiled build only when the two match: a build left over from
an older source (an edited checkout, another branch) is ignored, with a debug log, and the
pure-Python code runs instead. :data:`NATIVE` is the compiled module or None.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from types import ModuleType
from typing import Final

from notify.protocol import hotpath

log = logging.getLogger("notify.protocol.accel")

#: The compiled build's module name (never the source's: it must not shadow hotpath.py).
NATIVE_NAME: Final = "notify.protocol._hotpath_native"


def source_digest() -> str | None:
    """SHA-256 (hex) of ``hotpath.py`` as it is on disk now; None if it cannot be read."""
    path = hotpath.__file__
    if not path or not path.endswith(".py"):
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def choose(native: ModuleType | None, digest: str | None) -> ModuleType | None:
    """``native`` when it was built from the source whose hash is ``digest``, else None."""
    if native is None:
        return None
    built = getattr(native, "SOURCE_SHA256", None)
    if digest is None or built != digest:
        log.debug(
            "ignoring %s: built from hotpath.py sha256 %s, the source is now %s "
            "(scripts/build_native.py rebuilds it); using pure Python",
            getattr(native, "__file__", NATIVE_NAME),
            built,
            digest,
        )
        return None
    return native


def load() -> ModuleType | None:
    """Import the compiled build and return it if it matches the source (else None)."""
    try:
        native = importlib.import_module(NATIVE_NAME)
    except ImportError as e:  # not built (demo setup, no compiler) or built for another Python
        log.debug("no compiled hot path (%s): using pure Python", e)
        return None
    return choose(native, source_digest())


#: The compiled hot path when it matches ``hotpath.py``, else None (pure Python is used).
NATIVE: Final = load()
