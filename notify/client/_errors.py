"""Client-only exception classes (all derive from :class:`notify.errors.ClientError`)."""

from __future__ import annotations

from notify.errors import ClientError


class ListenerTimeoutError(ClientError):
    """A message listener ran longer than ``ConsumerConfig.listener_timeout_s``.

    Counted as a failed delivery (retried, then handed to the recover store). The listener
    thread itself cannot be stopped and keeps its executor worker until it returns.
    """

    retriable = True
