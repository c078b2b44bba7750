"""Verb tables: the decoded request's type -> the handler that serves it.

A connection is served through the table of its role (unauthenticated, authenticated,
admin: :class:`~notify.broker.service.BrokerService` builds one of each), so the checks a
role implies are made once, when the table is chosen, not per request: an unauthenticated
connection's table answers every verb but ``auth`` and ``quit`` with "authentication
required", an authenticated one's answers the admin verbs with 403.

:meth:`VerbTable.on` is typed so that a handler can only be registered for the request type
it takes; decoding errors (:class:`~notify.errors.ProtocolError` and its subclasses) resolve
to the table's error handler on first sight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from notify.broker.connection import Connection
from notify.errors import ProtocolError

R = TypeVar("R")
#: A handler as the table stores it (the request type is checked at registration).
AnyHandler = Callable[[Connection, Any], None]


class VerbTable(dict[type, AnyHandler]):
    """Request type -> handler, for one role."""

    def __init__(
        self,
        on_error: Callable[[Connection, ProtocolError], None],
        unknown: AnyHandler,
    ) -> None:
        super().__init__()
        self.on_error = on_error
        self.unknown = unknown

    def on(self, kind: type[R], handler: Callable[[Connection, R], None]) -> None:
        """Serve requests of type ``kind`` with ``handler``."""
        self[kind] = handler

    def __missing__(self, kind: type) -> AnyHandler:
        """A decoding error's class (its subclasses too) or, never from the parser, a type
        nobody registered; remembered for the next time."""
        handler: AnyHandler = self.on_error if issubclass(kind, ProtocolError) else self.unknown
        self[kind] = handler
        return handler
