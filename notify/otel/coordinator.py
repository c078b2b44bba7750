"""Wrappers of the XA coordinator: a transaction span per global transaction, a span per
participant's prepare, commit and rollback, and one for the logged decision."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import SpanKind

from . import spans
from .semconv import A_SYSTEM, A_TX_ID, A_XA_BRANCH, SYSTEM

Fn = Callable[..., Any]


def begin(orig: Fn) -> Fn:
    """``TransactionManager.begin()`` (and so ``transaction()``): a ``transaction xa``
    span, current until the transaction commits or rolls back."""

    @functools.wraps(orig)
    def wrapper(self: object, *a: Any, **kw: Any) -> Any:
        tx = orig(self, *a, **kw)
        span = spans.begin_transaction("xa", getattr(tx, "gtrid", b"").decode("ascii", "replace"))
        if span is not None:
            spans.hold(tx, span)
        return tx

    return wrapper


def end(orig: Fn) -> Fn:
    """``Transaction.commit()``/``rollback()``: the transaction's span ends with it."""

    @functools.wraps(orig)
    def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
        try:
            result = orig(self, *a, **kw)
        except BaseException as e:
            spans.end_transaction(self, e, _state(self))
            raise
        spans.end_transaction(self, None, _state(self))
        return result

    return wrapper


def _state(tx: Any) -> str | None:
    st = getattr(tx, "state", None)
    v = getattr(st, "value", None)
    return v.lower() if isinstance(v, str) else None


def branch(orig: Fn) -> Fn:
    """A participant's ``prepare``/``commit``/``rollback(xid, ...)``: a span each."""
    op = orig.__name__

    @functools.wraps(orig)
    def wrapper(self: object, xid: object, *a: Any, **kw: Any) -> Any:
        t = spans.tracer()
        if t is None:
            return orig(self, xid, *a, **kw)
        attrs = {A_SYSTEM: SYSTEM, A_XA_BRANCH: type(self).__name__, A_TX_ID: str(xid)}
        with t.start_as_current_span(f"xa {op}", kind=SpanKind.CLIENT, attributes=attrs) as sp:
            result = orig(self, xid, *a, **kw)
            vote = getattr(result, "name", None)  # a prepare's Vote
            if isinstance(vote, str):
                sp.set_attribute("notify.xa.vote", vote.lower())
            return result

    return wrapper


def decide(orig: Fn) -> Fn:
    """``DecisionLog.decide(decision)``: the durable commit decision."""

    @functools.wraps(orig)
    def wrapper(self: object, decision: Any, *a: Any, **kw: Any) -> Any:
        t = spans.tracer()
        if t is None:
            return orig(self, decision, *a, **kw)
        outcome = getattr(getattr(decision, "outcome", None), "name", None)
        attrs: dict[str, Any] = {A_SYSTEM: SYSTEM, "notify.xa.outcome": str(outcome)}
        with t.start_as_current_span("xa decision", attributes=attrs):
            return orig(self, decision, *a, **kw)

    return wrapper
