"""A local SparkSession set up for the audit, and a check that Spark can run here at all."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "new_session", "spark_missing"]

DEFAULT_MASTER: Final = "local[2]"


def spark_missing() -> str | None:
    """Why a local Spark cannot start on this machine (no pyspark, pyarrow or Java), else None."""
    for mod, pkg in (("pyspark", "pyspark>=4.0"), ("pyarrow", "pyarrow")):
        if importlib.util.find_spec(mod) is None:
            return f"{pkg} is not installed (bash scripts/spark.sh install)"
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) and not (
        shutil.which("java")
    ):
        return "no Java runtime (java on PATH or JAVA_HOME) for Spark"
    import pyspark

    major = int(pyspark.__version__.split(".")[0])
    if major < 4:
        return f"pyspark {pyspark.__version__} is too old: Python data sources need Spark >= 4.0"
    return None


def new_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "notify-audit",
    driver_memory: str = "2g",
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for the audit: loopback only, no UI, workers on this interpreter.

    Sets ``SPARK_LOCAL_IP=127.0.0.1`` and ``PYSPARK_PYTHON`` (to ``sys.executable``, so the
    executors find ``notify`` and pyarrow) unless already set. When a session is already
    active (tests, notebooks) it is returned as is, with the data sources registered.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from notify.audit.sources import register_sources

    cores = _cores(master)
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": driver_memory,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or max(4, 4 * cores)),
        "spark.sql.adaptive.enabled": "true",
        "spark.python.worker.reuse": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        **(extra_conf or {}),
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_sources(spark)
    return spark


def _cores(master: str) -> int:
    if master.startswith("local[") and master.endswith("]"):
        inner = master[6:-1].split(",")[0]
        if inner == "*":
            return os.cpu_count() or 2
        try:
            return max(1, int(inner))
        except ValueError:
            return 2
    return 2 if master != "local" else 1
