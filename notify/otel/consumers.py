"""Wrappers of the consuming side: listeners, ``messages()``, ``fetch()``, queue
consumers and their settling."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span

from . import spans
from .spans import SENDING, fail, start_client, start_process

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


def traced_listener(listener: Any, group: str | None) -> Any:
    """``listener`` with a ``process`` span around each call (async stays async)."""
    if listener is None or getattr(listener, _MARK, False):
        return listener
    is_async = inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
        getattr(listener, "__call__", None)  # noqa: B004
    )
    if is_async:

        async def alistener(msg: Any) -> Any:
            span = start_process(msg, group)
            if span is None:
                return await listener(msg)
            with trace.use_span(span, end_on_exit=True):
                return await listener(msg)

        setattr(alistener, _MARK, True)
        return alistener

    def plistener(msg: Any) -> Any:
        span = start_process(msg, group)
        if span is None:
            return listener(msg)
        with trace.use_span(span, end_on_exit=True):
            return listener(msg)

    setattr(plistener, _MARK, True)
    return plistener


def traced_batch_listener(listener: Any, group: str | None) -> Any:
    """A queue's ``batch_listener`` with one ``process`` span per batch, linked to the
    creation context of every message in it."""
    if listener is None or getattr(listener, _MARK, False):
        return listener
    is_async = inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
        getattr(listener, "__call__", None)  # noqa: B004
    )

    def start(msgs: list[Any]) -> Span | None:
        topic = getattr(msgs[0], "topic", None) if msgs else None
        span = start_client("process", "process", topic, msgs, group)
        return span

    if is_async:

        async def abatch(msgs: list[Any]) -> Any:
            span = start(msgs)
            if span is None:
                return await listener(msgs)
            with trace.use_span(span, end_on_exit=True):
                return await listener(msgs)

        setattr(abatch, _MARK, True)
        return abatch

    def pbatch(msgs: list[Any]) -> Any:
        span = start(msgs)
        if span is None:
            return listener(msgs)
        with trace.use_span(span, end_on_exit=True):
            return listener(msgs)

    setattr(pbatch, _MARK, True)
    return pbatch


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


def _process_each(msg: Any, group: str | None) -> tuple[Span | None, object]:
    span = start_process(msg, group)
    if span is None:
        return None, None
    return span, otel_context.attach(trace.set_span_in_context(span))


def _done(span: Span | None, token: object, error: BaseException | None) -> None:
    if span is None:
        return
    try:
        otel_context.detach(token)  # type: ignore[arg-type]
    finally:
        _end(span, error)


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
            span, token = _process_each(msg, group)
            try:
                yield msg
            finally:  # the caller asked for the next one, or stopped
                _done(span, token, None)

    return messages


def messages_async(orig: Fn) -> Fn:
    @functools.wraps(orig)
    async def messages(self: object, *a: Any, **kw: Any) -> AsyncIterator[Any]:
        group = group_of(self)
        async for msg in orig(self, *a, **kw):
            span, token = _process_each(msg, group)
            try:
                yield msg
            finally:  # the caller asked for the next one, or stopped
                _done(span, token, None)

    return messages


def _topic_of(args: tuple[Any, ...], kw: dict[str, Any]) -> str | None:
    t = kw.get("topic", args[0] if args else None)
    return t if isinstance(t, str) else None


def fetch_sync(orig: Fn) -> Fn:
    """``fetch(topic)``: a ``receive`` span linked to every message it returns."""

    @functools.wraps(orig)
    def fetch(self: object, *a: Any, **kw: Any) -> Any:
        if SENDING.get() or spans.tracer() is None:
            return orig(self, *a, **kw)
        token = SENDING.set(True)  # the blocking API runs the asyncio one: one span
        try:
            got = orig(self, *a, **kw)
        finally:
            SENDING.reset(token)
        _receive_span(self, a, kw, got)
        return got

    return fetch


def fetch_async(orig: Fn) -> Fn:
    async def traced(self: object, a: Any, kw: Any) -> Any:
        got = await orig(self, *a, **kw)
        _receive_span(self, a, kw, got)
        return got

    @functools.wraps(orig)
    def fetch(self: object, *a: Any, **kw: Any) -> Any:
        if SENDING.get() or spans.tracer() is None:
            return orig(self, *a, **kw)
        return traced(self, a, kw)

    return fetch


def _receive_span(consumer: object, a: tuple[Any, ...], kw: dict[str, Any], got: Any) -> None:
    msgs = list(got) if isinstance(got, list) else ([] if got is None else [got])
    topic = _topic_of(a, kw)
    if topic is None and msgs:
        topic = getattr(msgs[0], "topic", None)
    span = start_client("receive", "receive", topic, msgs, group_of(consumer))
    if span is not None:
        span.end()


def queue_get_sync(orig: Fn) -> Fn:
    """A queue consumer's ``get()``: a ``receive`` span linked to the message."""

    @functools.wraps(orig)
    def get(self: object, *a: Any, **kw: Any) -> Any:
        if SENDING.get() or spans.tracer() is None:
            return orig(self, *a, **kw)
        token = SENDING.set(True)
        try:
            got = orig(self, *a, **kw)
        finally:
            SENDING.reset(token)
        if got is not None:
            _receive_span(self, (getattr(got, "topic", None),), {}, got)
        return got

    return get


def queue_get_async(orig: Fn) -> Fn:
    async def traced(self: object, a: Any, kw: Any) -> Any:
        got = await orig(self, *a, **kw)
        if got is not None:
            _receive_span(self, (getattr(got, "topic", None),), {}, got)
        return got

    @functools.wraps(orig)
    def get(self: object, *a: Any, **kw: Any) -> Any:
        if SENDING.get() or spans.tracer() is None:
            return orig(self, *a, **kw)
        return traced(self, a, kw)

    return get


def settle_sync(orig: Fn) -> Fn:
    """``ack``/``release``/``reject`` of a queue message: a settle span."""
    op = orig.__name__

    @functools.wraps(orig)
    def settle(self: object, *a: Any, **kw: Any) -> Any:
        if SENDING.get() or spans.tracer() is None:
            return orig(self, *a, **kw)
        span = start_client(op, "settle", getattr(self, "topic", None), [self], _qgroup(self))
        token = SENDING.set(True)
        try:
            result = orig(self, *a, **kw)
        except BaseException as e:
            if span is not None:
                _end(span, e)
            raise
        finally:
            SENDING.reset(token)
        if span is not None:
            span.set_attribute("notify.settled", bool(result))
            span.end()
        return result

    return settle


def settle_async(orig: Fn) -> Fn:
    op = orig.__name__

    async def traced(self: object, a: Any, kw: Any) -> Any:
        span = start_client(op, "settle", getattr(self, "topic", None), [self], _qgroup(self))
        try:
            result = await orig(self, *a, **kw)
        except BaseException as e:
            if span is not None:
                _end(span, e)
            raise
        if span is not None:
            span.set_attribute("notify.settled", bool(result))
            span.end()
        return result

    @functools.wraps(orig)
    def settle(self: object, *a: Any, **kw: Any) -> Any:
        if SENDING.get() or spans.tracer() is None:
            return orig(self, *a, **kw)
        return traced(self, a, kw)

    return settle


def _qgroup(msg: object) -> str | None:
    try:
        g = getattr(msg, "group", None)
    except Exception:
        return None
    return g if isinstance(g, str) else None
