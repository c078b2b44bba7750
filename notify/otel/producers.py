"""Wrappers of the producing side: sends, batches, local and outbox transactions, half
messages, ``Outbox.send`` and the outbox relay's publisher."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import Token
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from notify.outbox import Batch, Identity, PublishAck, Publisher, PublishError

from . import spans
from .calls import Done, arg, both, sync_call
from .semconv import (
    A_BATCH,
    A_MSG_ID,
    A_PARTITION,
    attributes,
    inject,
    link,
    record_headers,
    span_name,
)
from .spans import BEGINNING, EXITING, SENDING, fail, producer_span, set_result

Fn = Callable[..., Any]


@contextmanager
def _send(_self: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Done]:
    """``send(topic, data, ..., headers=)``: a ``send`` span, its context in the headers."""
    with producer_span("send", arg(args, kwargs, 0, "topic")) as span:
        kwargs["headers"] = inject(kwargs.get("headers"))
        yield functools.partial(set_result, span)


@contextmanager
def _send_plain(_self: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Done]:
    """A ``send`` span around a send that takes no headers (an XA broker branch's
    ``BrokerProducer.send``): its message carries no trace context."""
    with producer_span("send", arg(args, kwargs, 0, "topic")) as span:
        yield functools.partial(set_result, span)


@contextmanager
def _batch(_self: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Done]:
    """``send_batch(topic, datas, ...)``: one ``send`` span for the batch (its messages
    carry no headers of their own, so no trace context)."""
    datas = arg(args, kwargs, 1, "datas") or ()
    with producer_span("send", arg(args, kwargs, 0, "topic"), **{A_BATCH: len(datas)}) as span:
        yield functools.partial(set_result, span)


send_sync, send_async = both(_send)
batch_sync, batch_async = both(_batch)


@contextmanager
def _post(_self: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Done]:
    """``post(topic, data, ..., headers=)`` (fire and forget, no result to wait for): a
    ``create`` span for the call, its context in the headers."""
    with producer_span("create", arg(args, kwargs, 0, "topic")) as span:
        kwargs["headers"] = inject(kwargs.get("headers"))
        yield functools.partial(set_result, span)


def post(orig: Fn) -> Fn:
    return sync_call(orig, _post)


def _settle(span: Span, fut: Any) -> None:
    """End a deferred send's span with its future's outcome."""
    if fut.cancelled():
        span.set_status(Status(StatusCode.ERROR, "cancelled"))
    elif (e := fut.exception()) is not None:
        fail(span, e)
    else:
        set_result(span, fut.result())
    span.end()


def _deferred(orig: Fn, headers: bool) -> Fn:
    """A method that queues and returns a future (``send_future``, ``send_nowait``, their
    batch forms): a ``send`` span from the call until the future is done, carrying its
    result; with ``headers`` its context goes into the message's headers."""

    @functools.wraps(orig)
    def wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
        t = spans.tracer()
        if t is None or SENDING.get():
            return orig(self, *args, **kwargs)
        topic = arg(args, kwargs, 0, "topic")
        extra = {} if headers else {A_BATCH: len(arg(args, kwargs, 1, "datas") or ())}
        span = t.start_span(
            span_name("send", topic),
            kind=SpanKind.PRODUCER,
            attributes=attributes("send", "send", topic, **extra),
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        guard = SENDING.set(True)
        try:
            if headers:
                kwargs["headers"] = inject(kwargs.get("headers"))
            fut = orig(self, *args, **kwargs)
        except BaseException as e:
            fail(span, e)
            span.end()
            raise
        finally:
            SENDING.reset(guard)
            otel_context.detach(token)
        fut.add_done_callback(functools.partial(_settle, span))
        return fut

    return wrapper


def send_later(orig: Fn) -> Fn:
    return _deferred(orig, headers=True)


def batch_later(orig: Fn) -> Fn:
    return _deferred(orig, headers=False)


def send_plain(orig: Fn) -> Fn:
    return sync_call(orig, _send_plain)


# ------------------------------------------------------------------ transactions


def begin(orig: Fn) -> Fn:
    """``transaction()`` / ``begin_transaction()`` of a producer: a transaction span
    (``local``, or ``outbox`` with ``db=``), current until the transaction ends, so the
    block's sends are its children."""

    @functools.wraps(orig)
    def begin_transaction(self: object, *args: Any, **kwargs: Any) -> Any:
        if BEGINNING.get() or spans.tracer() is None:
            return orig(self, *args, **kwargs)
        db = kwargs.get("db", args[1] if len(args) > 1 else None)
        span = spans.begin_transaction("outbox" if db is not None else "local")
        token = BEGINNING.set(True)
        try:
            tx = orig(self, *args, **kwargs)
        except BaseException as e:
            if span is not None:
                fail(span, e)
                span.end()
            raise
        finally:
            BEGINNING.reset(token)
        if span is not None:
            key = getattr(tx, "key", None)
            if key is not None:
                span.set_attribute("notify.transaction.id", str(key))
            spans.hold(tx, span)
        return tx

    return begin_transaction


@contextmanager
def _ending(tx: object, is_exit: bool, args: tuple[Any, ...]) -> Iterator[None]:
    """End ``tx``'s span after the call: with the call's exception, or an exit's."""
    token = EXITING.set(True) if is_exit else None
    error = args[1] if is_exit and len(args) > 1 else None
    try:
        yield
    except BaseException as e:
        error = e
        raise
    finally:
        if token is not None:
            EXITING.reset(token)
        spans.end_transaction(tx, error if isinstance(error, BaseException) else None)


def end_sync(orig: Fn) -> Fn:
    """``commit``/``rollback``/``__exit__`` of a transaction: its span ends with it (an
    exit's own commit or rollback leaves the span to the exit, which knows the error)."""
    is_exit = orig.__name__ == "__exit__"

    @functools.wraps(orig)
    def end(self: object, *args: Any, **kwargs: Any) -> Any:
        if EXITING.get():
            return orig(self, *args, **kwargs)
        with _ending(self, is_exit, args):
            return orig(self, *args, **kwargs)

    return end


def end_async(orig: Fn) -> Fn:
    is_exit = orig.__name__ == "__aexit__"

    @functools.wraps(orig)
    async def end(self: object, *args: Any, **kwargs: Any) -> Any:
        if EXITING.get():
            return await orig(self, *args, **kwargs)
        with _ending(self, is_exit, args):
            return await orig(self, *args, **kwargs)

    return end


# ------------------------------------------------------------------ half messages


class _HalfSpans:
    """A half message's transaction span (current in the block) and its message's
    ``send`` span (whose context the message carries)."""

    def __init__(self, topic: str):
        self.tx = spans.begin_transaction("half", topic=topic)
        t = spans.tracer()
        self.send: Span | None = None
        if t is not None and self.tx is not None:
            self.send = t.start_span(
                span_name("send", topic),
                context=trace.set_span_in_context(self.tx),
                kind=SpanKind.PRODUCER,
                attributes=attributes("send", "send", topic),
            )
        self._token: Token[Context] | None = None

    def headers(self, given: Mapping[str, Any] | None) -> dict[str, Any]:
        if self.send is None:
            return dict(given or {})
        return inject(given, trace.set_span_in_context(self.send))

    def enter(self) -> None:
        if self.tx is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self.tx))

    def exit(self, error: BaseException | None) -> None:
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None
        for span in (self.send, self.tx):
            if span is not None:
                if error is not None:
                    fail(span, error)
                span.end()


class _TracedBlock:
    """A half message's ``with``/``async with`` block, inside its spans."""

    def __init__(self, inner: Any, hs: _HalfSpans):
        self._inner = inner
        self._hs = hs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __enter__(self) -> Any:
        self._hs.enter()
        try:
            return self._inner.__enter__()
        except BaseException as e:
            self._hs.exit(e)
            raise

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> Any:
        err = e
        try:
            return self._inner.__exit__(et, e, tb)
        except BaseException as x:
            err = x
            raise
        finally:
            self._hs.exit(err)

    async def __aenter__(self) -> Any:
        self._hs.enter()
        try:
            return await self._inner.__aenter__()
        except BaseException as e:
            self._hs.exit(e)
            raise

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> Any:
        err = e
        try:
            return await self._inner.__aexit__(et, e, tb)
        except BaseException as x:
            err = x
            raise
        finally:
            self._hs.exit(err)


def half_message(orig: Fn) -> Fn:
    """``half_message(topic, data, ...)``: the block runs in a ``transaction half`` span;
    the message's ``send`` span (PREPARE to COMMIT) is its child."""

    @functools.wraps(orig)
    def wrapper(self: object, topic: str, data: bytes, *args: Any, **kwargs: Any) -> Any:
        if spans.tracer() is None:
            return orig(self, topic, data, *args, **kwargs)
        hs = _HalfSpans(topic)
        kwargs["headers"] = hs.headers(kwargs.get("headers"))
        try:
            block = orig(self, topic, data, *args, **kwargs)
        except BaseException as e:
            hs.exit(e)
            raise
        return _TracedBlock(block, hs)

    return wrapper


@contextmanager
def _in_transaction(_self: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Done]:
    """``send_in_transaction(topic, data, local_tx, ...)``: the spans of a half message
    around the call (``local_tx`` runs in the transaction span)."""
    hs = _HalfSpans(arg(args, kwargs, 0, "topic"))
    kwargs["headers"] = hs.headers(kwargs.get("headers"))
    hs.enter()
    error: BaseException | None = None
    try:
        yield functools.partial(set_result, hs.send)
    except BaseException as e:
        error = e
        raise
    finally:
        hs.exit(error)


in_transaction_sync, in_transaction_async = both(_in_transaction)


# ------------------------------------------------------------------ the outbox


def outbox_send(orig: Fn) -> Fn:
    """``Outbox.send(conn, topic, data, ...)``: a ``create`` span in the application's
    transaction; the row carries its context, which the relay links to and the consumer
    continues."""

    @functools.wraps(orig)
    def send(self: object, conn: object, topic: str, data: bytes, *a: Any, **kw: Any) -> Any:
        if spans.tracer() is None:
            return orig(self, conn, topic, data, *a, **kw)
        with producer_span("create", topic):
            kw["headers"] = inject(kw.get("headers"))
            return orig(self, conn, topic, data, *a, **kw)

    return send


class TracedPublisher:
    """The relay's :class:`~notify.outbox.Publisher` with a ``send`` span per batch,
    linked to the creation context of every row it carries."""

    def __init__(self, inner: Publisher):
        self.inner = inner

    def partitions(self, topic: str) -> Sequence[str]:
        return self.inner.partitions(topic)

    def claim(
        self, identity: Identity, topics: Sequence[str]
    ) -> Mapping[tuple[str, str], int] | None:
        return self.inner.claim(identity, topics)

    def close(self) -> None:
        self.inner.close()

    def publish(
        self, identity: Identity, batches: Sequence[Batch]
    ) -> list[PublishAck | PublishError]:
        t = spans.tracer()
        if t is None:
            return self.inner.publish(identity, batches)
        started: list[Span] = []
        for b in batches:
            links: list[Link] = [
                lk
                for flag, payload in b.records
                if (lk := link(record_headers(flag, payload))) is not None
            ]
            extra: dict[str, Any] = {
                A_PARTITION: b.partition,
                "notify.producer.name": identity.name,
            }
            if len(b.records) > 1:
                extra[A_BATCH] = len(b.records)
            started.append(
                t.start_span(
                    span_name("send", b.topic),
                    kind=SpanKind.PRODUCER,
                    links=links or None,
                    attributes=attributes("send", "send", b.topic, **extra),
                )
            )
        try:
            acks = self.inner.publish(identity, batches)
        except BaseException as e:
            for span in started:
                fail(span, e)
                span.end()
            raise
        for span, ack in zip(started, acks, strict=False):
            if isinstance(ack, PublishError):
                fail(span, ack)
            elif ack.count == 1:
                span.set_attribute(A_MSG_ID, str(ack.first_msg_id))
            span.end()
        return acks


def relay_start(orig: Fn) -> Fn:
    """``Relay.start()``: its publisher traced (see :class:`TracedPublisher`)."""

    @functools.wraps(orig)
    def start(self: Any) -> Any:
        if spans.tracer() is not None and not isinstance(self.publisher, TracedPublisher):
            self.publisher = TracedPublisher(self.publisher)
        return orig(self)

    return start
