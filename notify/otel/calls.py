"""One way to wrap a method call in a span, for both APIs: :func:`sync_call` and
:func:`async_call` run ``begin(self, args, kwargs)`` — a context manager that starts the
span (and may change ``kwargs``, e.g. to add the trace context to the headers) and yields
the callback that reads the call's result — around the original call."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from . import spans
from .spans import SENDING

Fn = Callable[..., Any]
Done = Callable[[Any], None]
Begin = Callable[[Any, tuple[Any, ...], dict[str, Any]], AbstractContextManager[Done]]


def _skip(guard: contextvars.ContextVar[bool]) -> bool:
    return guard.get() or spans.tracer() is None


def sync_call(orig: Fn, begin: Begin, guard: contextvars.ContextVar[bool] = SENDING) -> Fn:
    """``orig`` inside ``begin``'s span; ``guard`` is set meanwhile, so that a call the
    client makes on the way (a blocking method running its asyncio twin) is not traced
    twice, and a call made while it is set is not traced at all."""

    @functools.wraps(orig)
    def wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
        if _skip(guard):
            return orig(self, *args, **kwargs)
        with begin(self, args, kwargs) as done:
            token = guard.set(True)
            try:
                result = orig(self, *args, **kwargs)
            finally:
                guard.reset(token)
            done(result)
            return result

    return wrapper


def async_call(orig: Fn, begin: Begin, guard: contextvars.ContextVar[bool] = SENDING) -> Fn:
    """The coroutine form of :func:`sync_call`: whether to trace is decided when the
    method is called (in the caller's context), the span runs with the coroutine."""

    async def traced(self: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with begin(self, args, kwargs) as done:
            token = guard.set(True)
            try:
                result = await orig(self, *args, **kwargs)
            finally:
                guard.reset(token)
            done(result)
            return result

    @functools.wraps(orig)
    def wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
        if _skip(guard):
            return orig(self, *args, **kwargs)
        return traced(self, args, kwargs)

    return wrapper


def both(begin: Begin) -> tuple[Callable[[Fn], Fn], Callable[[Fn], Fn]]:
    """The sync and async wrapper makers of one ``begin``."""
    return (lambda orig: sync_call(orig, begin)), (lambda orig: async_call(orig, begin))


def arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str) -> Any:
    """A call's argument given by position or by name (None when absent)."""
    return args[pos] if len(args) > pos else kwargs.get(name)
