"""Errors of the configserver, classified by behaviour (under :class:`notify.errors.NotifyError`).

Tree::

    NotifyError
    └── ConfigServerError              membership/discovery failed (permanent unless retriable)
        ├── ConfigServerUnavailableError  not connected / timed out (retriable: try again later)
        ├── NoNodeError                   the node does not exist
        ├── NodeExistsError               the node already exists
        └── BadVersionError               a conditional write lost a race

Backends translate their foreign exceptions (kazoo's) into these at their boundary.
"""

from __future__ import annotations

from notify.errors import NotifyError

__all__ = [
    "BadVersionError",
    "ConfigServerError",
    "ConfigServerUnavailableError",
    "NoNodeError",
    "NodeExistsError",
]


class ConfigServerError(NotifyError):
    """A membership or discovery operation failed."""


class ConfigServerUnavailableError(ConfigServerError):
    """The configserver is not reachable right now (connection suspended, lost, or timed out).

    Nothing may be assumed done; the same call may succeed once the session is back.
    """

    retriable = True


class NoNodeError(ConfigServerError):
    """The node does not exist."""


class NodeExistsError(ConfigServerError):
    """The node exists already."""


class BadVersionError(ConfigServerError):
    """The node changed since it was read (a conditional write lost a race)."""
