"""Spark audit of committed transactions: ``notify audit`` and a library.

Needs the optional ``audit`` extra (``pyspark>=4.0``, ``pyarrow``) and Java 17; nothing here
imports Spark until it is used, so ``notify`` itself runs without them::

    from notify.audit import audit, new_session
    spark = new_session("local[2]")
    result = audit(spark, txlog="data/transactions", data="data")
    result.findings.show()

Modules: :mod:`~notify.audit.formats` (file readers, no Spark), :mod:`~notify.audit.sources`
(the ``notify-log`` / ``notify-txlog`` Python data sources), :mod:`~notify.audit.checks`
(the audit, stage by stage: inputs and counting passes), :mod:`~notify.audit.transactions`
(transaction incarnations), :mod:`~notify.audit.matching` (expected messages against the
partitions), :mod:`~notify.audit.findings` (one builder per check), :mod:`~notify.audit.carry`
and :mod:`~notify.audit.state` (incremental runs), :mod:`~notify.audit.coordinator` (XA
decision log), :mod:`~notify.audit.report` (Parquet, JSON, HTML), :mod:`~notify.audit.cli`
(the click command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from notify.audit.checks import AuditResult, audit
    from notify.audit.session import new_session, spark_missing
    from notify.audit.sources import register_sources

__all__ = ["AuditResult", "audit", "new_session", "register_sources", "spark_missing"]

_WHERE = {
    "AuditResult": "notify.audit.checks",
    "audit": "notify.audit.checks",
    "new_session": "notify.audit.session",
    "spark_missing": "notify.audit.session",
    "register_sources": "notify.audit.sources",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'notify.audit' has no attribute {name!r}")
