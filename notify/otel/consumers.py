"""Wrappers of the consuming side: listeners, ``messages()``, ``fetch()``, queue
consumers and their settling."""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from . import spans
from .calls import Begin, Done, arg, async_call, both, sync_call
from .spans import fail, start_client, start_process

Fn = Callable[..., Any]
_MARK = "__notify_otel_listener__"


def group_of(consumer: object) -> str | None:
    """The consumer group of a consumer (its config's ``group``), if it has one."""
    for holder in (consumer, getattr(consumer, "core", None)):
        cfg = getattr(holder, "config", None)
        g = getattr(cfg, "group", None)
        if isinstance(g, str):
            return g
        g = getattr(holder, "group", None)
        if isinstance(g, str):
            return g
    return None


def _end(span: Span, error: BaseException | None) -> None:
    if error is not None:
        fail(span, error)
    span.end()


def _in_span(fn: Any, start: Callable[[Any], Span | None]) -> Any:
    """``fn(x)`` inside the span ``start(x)`` (async stays async); marked, so that the
    blocking API handing it to the asyncio one does not wrap it twice."""
    if fn is None or getattr(fn, _MARK, False):
        return fn

    def scope(x: Any) -> AbstractContextManager[Any]:
        span = start(x)
        return nullcontext() if span is None else trace.use_span(span, end_on_exit=True)

    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    ):

        async def acall(x: Any) -> Any:
            with scope(x):
                return await fn(x)

        setattr(acall, _MARK, True)
        return acall

    def call(x: Any) -> Any:
        with scope(x):
            return fn(x)

    setattr(call, _MARK, True)
    return call


def traced_listener(listener: Any, group: str | None) -> Any:
    """``listener`` with a ``process`` span around each message."""
    return _in_span(listener, lambda msg: start_process(msg, group))


def traced_batch_listener(listener: Any, group: str | None) -> Any:
    """A queue's ``batch_listener`` with one ``process`` span per batch, linked to the
    creation context of every message in it."""

    def start(msgs: list[Any]) -> Span | None:
        topic = getattr(msgs[0], "topic", None) if msgs else None
        return start_client("process", "process", topic, msgs, group)

    return _in_span(listener, start)


def queue_consumer(orig: Fn) -> Fn:
    """``create_queue_consumer(topic, group, credit, listener, start, batch_listener)``:
    its listener processes each message in a ``process`` span, its batch listener each
    batch."""

    @functools.wraps(orig)
    def create(self: object, topic: str, group: str, *a: Any, **kw: Any) -> Any:
        if spans.tracer() is not None:
            args = list(a)
            for pos, name, wrap in (
                (1, "listener", traced_listener),
                (3, "batch_listener", traced_batch_listener),
            ):
                if len(args) > pos:
                    args[pos] = wrap(args[pos], group)
                elif name in kw:
                    kw[name] = wrap(kw[name], group)
            a = tuple(args)
        return orig(self, topic, group, *a, **kw)

    return create


def subscribe(orig: Fn) -> Fn:
    """``subscribe(topic, listener, ...)``: each message the listener gets is processed in
    a ``process`` span (child of the message's creation context, linked to it)."""

    @functools.wraps(orig)
    def wrapper(self: object, topic: str, listener: Any = None, *a: Any, **kw: Any) -> Any:
        if spans.tracer() is not None:
            listener = traced_listener(listener, group_of(self))
        return orig(self, topic, listener, *a, **kw)

    return wrapper


def _process_each(msg: Any, group: str | None) -> tuple[Span | None, Token[Context] | None]:
    span = start_process(msg, group)
    if span is None:
        return None, None
    return span, otel_context.attach(trace.set_span_in_context(span))


def _done(span: Span | None, token: Token[Context] | None, error: BaseException | None) -> None:
    if span is None or token is None:
        return
    try:
        otel_context.detach(token)
    finally:
        _end(span, error)


@contextmanager
def _processing(msg: Any, group: str | None) -> Iterator[None]:
    """The message's ``process`` span, current for the block (ended as it leaves, an
    iteration stopped early included: that is no error of the message's)."""
    span, token = _process_each(msg, group)
    try:
        yield
    finally:
        _done(span, token, None)


def messages_sync(orig: Fn) -> Fn:
    """``messages(...)`` of a blocking consumer: each message is processed in a
    ``process`` span, current while the caller's loop body runs (until it asks for the
    next message)."""

    @functools.wraps(orig)
    def messages(self: object, *a: Any, **kw: Any) -> Iterator[Any]:
        if spans.tracer() is None:
            yield from orig(self, *a, **kw)
            return
        group = group_of(self)
        for msg in orig(self, *a, **kw):
            with _processing(msg, group):  # until the caller asks for the next one
                yield msg

    return messages


def messages_async(orig: Fn) -> Fn:
    @functools.wraps(orig)
    async def messages(self: object, *a: Any, **kw: Any) -> AsyncIterator[Any]:
        group = group_of(self)
        async for msg in orig(self, *a, **kw):
            with _processing(msg, group):  # until the caller asks for the next one
                yield msg

    return messages


def _receive_span(consumer: object, topic: str | None, got: Any, start_ns: int) -> None:
    """A ``receive`` span from ``start_ns`` to now, linked to every message received."""
    msgs = list(got) if isinstance(got, list) else ([] if got is None else [got])
    if topic is None and msgs:
        topic = getattr(msgs[0], "topic", None)
    span = start_client("receive", "receive", topic, msgs, group_of(consumer), start_ns)
    if span is not None:
        span.end()


@contextmanager
def _fetch(self: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Done]:
    """``fetch(topic)``: a ``receive`` span linked to every message it returns."""
    start = time.time_ns()
    topic = arg(args, kwargs, 0, "topic")
    yield lambda got: _receive_span(self, topic, got, start)


@contextmanager
def _queue_get(self: object, _a: tuple[Any, ...], _kw: dict[str, Any]) -> Iterator[Done]:
    """A queue consumer's ``get()``: a ``receive`` span linked to the message."""
    start = time.time_ns()

    def done(got: Any) -> None:
        if got is not None:
            _receive_span(self, getattr(got, "topic", None), got, start)

    yield done


def _settle(op: str) -> Begin:
    @contextmanager
    def begin(self: object, _a: tuple[Any, ...], _kw: dict[str, Any]) -> Iterator[Done]:
        """``ack``/``release``/``reject`` of a queue message: a settle span."""
        span = start_client(op, "settle", getattr(self, "topic", None), [self], _qgroup(self))
        if span is None:
            yield lambda _r: None
            return
        with trace.use_span(span, end_on_exit=True):
            yield lambda r: span.set_attribute("notify.settled", bool(r))

    return begin


fetch_sync, fetch_async = both(_fetch)
queue_get_sync, queue_get_async = both(_queue_get)


def settle_sync(orig: Fn) -> Fn:
    return sync_call(orig, _settle(orig.__name__))


def settle_async(orig: Fn) -> Fn:
    return async_call(orig, _settle(orig.__name__))


def _qgroup(msg: object) -> str | None:
    try:
        g = getattr(msg, "group", None)
    except Exception:
        return None
    return g if isinstance(g, str) else None
