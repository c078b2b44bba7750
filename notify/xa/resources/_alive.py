"""Is a pooled connection's peer still there? One non-blocking MSG_PEEK, no round trip."""

from __future__ import annotations

import socket


def peer_closed(fd: int) -> bool:
    """True when socket ``fd`` should not be reused: the peer closed or reset it, or bytes
    nobody asked for are waiting (the protocol would be out of step)."""
    if fd < 0:
        return True
    try:
        s = socket.socket(fileno=fd)
    except OSError:
        return True
    try:
        s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.detach()  # the descriptor stays owned by its driver
