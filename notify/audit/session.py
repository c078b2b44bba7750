"""A local SparkSession set up for the audit, and a check that Spark can run here at all."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Final

from notify.audit import formats

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_MASTER",
    "LARGE_INPUT_JAVA_OPTIONS",
    "SMALL_INPUT_BYTES",
    "code_zip",
    "input_bytes",
    "is_local",
    "new_session",
    "sizing_conf",
    "spark_missing",
]

DEFAULT_MASTER: Final = "local[2]"
#: Inputs below this many bytes are audited without whole-stage code generation (compiling
#: the generated code costs more than it saves on them).
SMALL_INPUT_BYTES: Final = 32 * 2**20
#: JVM options of the driver and executors for small inputs: the JIT's first tier only and
#: the serial collector (a short audit spends much of its CPU compiling and collecting).
SMALL_INPUT_JAVA_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xss4m"
#: Classes whose methods the optimizing JIT gives up on at once (they stay at C1's code):
#: the driver's machinery, not the rows' hot loops. Janino compiling Spark's generated code,
#: the closure cleaner's ASM, the SQL parser, Java serialization of tasks and the JDK's
#: lambda spinning took 24 of 76 CPU-s of C2 compiling in a 1M transaction audit
#: (``-XX:+LogCompilation``), and ran too briefly to earn it back.
C1_ONLY_CLASSES: Final = (
    "org/codehaus/*.*",
    "org/apache/xbean/*.*",
    "org/antlr/*.*",
    "java/io/Object*.*",
    "jdk/internal/org/*.*",
    "org/apache/spark/sql/catalyst/trees/*.*",
    "org/apache/spark/sql/catalyst/analysis/*.*",
    "org/apache/spark/sql/catalyst/optimizer/*.*",
    "org/apache/spark/sql/catalyst/plans/*.*",
    "org/apache/spark/sql/catalyst/rules/*.*",
    "org/apache/spark/sql/catalyst/parser/*.*",
    "org/apache/spark/sql/execution/ExplainUtils*.*",
)
#: JVM options for larger audits: the parallel (throughput) collector, and the optimizing
#: JIT (C2) only for methods that stay hot and are not in C1_ONLY_CLASSES (C2 stops at
#: its node limit there, and the method keeps C1's code). Spark generates new code for
#: every query, and with the default thresholds compiling took about half of the JVM's
#: CPU in a 1M transaction audit (``-XX:+CITime``: 93-97 of 191-195 CPU-s on two cores).
#: Measured on that audit, A/B in alternation (session 11): four times the default tier-4
#: invocation threshold and three times the loop threshold, as before: 119.3 / 120.5 s,
#: 91 CPU-s of compiling; eight and six times with C1_ONLY_CLASSES: 113.0 / 113.9 s, 62-64
#: CPU-s (the default thresholds with C1_ONLY_CLASSES: 112.2 s against 104.1 s in one
#: pair of runs; sixteen and twelve times: 110.7 s, the methods stay too long profiled).
LARGE_INPUT_JAVA_OPTIONS: Final = (
    "-XX:+UseParallelGC -Xss4m -XX:Tier4InvocationThreshold=40000"
    " -XX:Tier4CompileThreshold=80000 -XX:Tier4BackEdgeThreshold=240000"
    " -XX:CompileCommand=quiet"
    + "".join(f" -XX:CompileCommand=MaxNodeLimit,{c},100" for c in C1_ONLY_CLASSES)
)


def spark_missing() -> str | None:
    """Why a local Spark cannot start on this machine (no pyspark, pyarrow or Java), else None."""
    for mod, pkg in (("pyspark", "pyspark>=4.0"), ("pyarrow", "pyarrow"), ("numpy", "numpy")):
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
    ship_code: bool | None = None,
    input_bytes: int | None = None,
) -> SparkSession:
    """A SparkSession for the audit: no UI, Python workers on this interpreter.

    ``local[...]`` masters run on loopback only (``SPARK_LOCAL_IP=127.0.0.1`` unless set).
    Any other master (``spark://host:7077``, ``yarn``...) is a cluster: the driver listens
    where ``SPARK_LOCAL_IP`` (else Spark's default) says so the executors can connect back,
    their Python is ``spark.pyspark.python`` (default this interpreter's path, which must
    exist on every worker, with pyarrow), and unless ``ship_code`` is False the ``notify``
    and ``txlog`` packages are sent to them as a zip (``addPyFile``). The broker's files
    must be at the same path on every executor (see README "Audit with Spark").

    ``input_bytes`` (the broker files' size, :func:`input_bytes`) sizes the session with
    :func:`sizing_conf` (shuffle partitions, code generation); ``shuffle_partitions`` and
    ``extra_conf`` override it.

    When a session is already active (tests, notebooks) it is returned with these settings
    applied to it, and the data sources registered.
    """
    local = is_local(master)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from notify.audit.sources import register_sources

    cores = _cores(master)
    sized = sizing_conf(input_bytes, cores) if input_bytes is not None else {}
    conf = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": driver_memory,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(max(4, 4 * cores)),
        "spark.sql.adaptive.enabled": "true",
        "spark.python.worker.reuse": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # the per-transaction aggregate collects lists: keep it hash-based for as many keys
        # as a task sees (Spark's default 128 sorts everything beyond that)
        "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "131072",
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
    }
    conf.update(sized)
    if shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    host = os.environ.get("SPARK_LOCAL_IP")
    if host:
        conf["spark.driver.host"] = host
        conf["spark.driver.bindAddress"] = host
    conf.update(extra_conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if (not local if ship_code is None else ship_code) and not getattr(
        spark.sparkContext, "_notify_shipped", False
    ):
        spark.sparkContext.addPyFile(str(code_zip()))
        spark.sparkContext._notify_shipped = True  # type: ignore[attr-defined]
    register_sources(spark)
    return spark


def sizing_conf(input_bytes: int, cores: int) -> dict[str, str]:
    """Spark settings that fit an audit of ``input_bytes`` on ``cores`` cores: 4 shuffle
    partitions per core (at least 4); below :data:`SMALL_INPUT_BYTES` one shuffle partition,
    no whole-stage code generation, no locality wait and :data:`SMALL_INPUT_JAVA_OPTIONS`
    for the JVMs started for it (a small audit spends more time compiling its plans than
    running them: about 40 % less CPU on the tests' logs)."""
    if input_bytes >= SMALL_INPUT_BYTES:
        return {
            "spark.sql.shuffle.partitions": str(max(4, 4 * cores)),
            # smaller generated methods: the optimizing JIT's register allocation and loop
            # passes grow faster than a method's size (1M transactions, two runs each:
            # 100.7/100.9 s and 174-175 CPU-s against 103.5/105.0 s and 179-181 at the
            # default 1024; 128 was no better than 1024)
            "spark.sql.codegen.methodSplitThreshold": "256",
            # the cached inputs are read a few times in one run: building compressed
            # column batches cost more than it saved (1M transactions: ~7 s of 150)
            "spark.sql.inMemoryColumnarStorage.compressed": "false",
            # keep a task per core after adaptive coalescing (64 MiB made 3 tasks of
            # the message join's exchange on 2 cores)
            "spark.sql.adaptive.advisoryPartitionSizeInBytes": "16m",
            # the throughput collector: G1's write barriers and concurrent marking cost a
            # long audit ~8 % on 2 cores (1M transactions: 137 -> 126 s)
            "spark.driver.extraJavaOptions": LARGE_INPUT_JAVA_OPTIONS,
            "spark.executor.extraJavaOptions": LARGE_INPUT_JAVA_OPTIONS,
        }
    return {
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.codegen.wholeStage": "false",
        "spark.driver.extraJavaOptions": SMALL_INPUT_JAVA_OPTIONS,
        "spark.executor.extraJavaOptions": SMALL_INPUT_JAVA_OPTIONS,
        # a task waits 3 s for the executor caching its input by default: moving a few
        # cached rows to an idle executor is cheaper
        "spark.locality.wait": "0s",
    }


def input_bytes(txlog: str | os.PathLike[str], data: str | os.PathLike[str]) -> int:
    """Bytes of the redo files and partition segments an audit of these directories reads
    (FileNotFoundError when a directory is missing)."""
    redo = formats.find_txlog_files(formats.txlog_dir(txlog), checkpoint=False)
    return sum(f.size for f in redo) + sum(s.size for s in formats.find_segments(data))


def is_local(master: str) -> bool:
    """Whether ``master`` runs everything in this process (``local``, ``local[N]``...)."""
    return master == "local" or master.startswith("local[")


def code_zip() -> Path:
    """A zip of the ``notify`` package (``.py`` files) for the executors,
    made once per process in the temp directory."""
    global _ZIP
    if _ZIP is None or not _ZIP.exists():
        fd, name = tempfile.mkstemp(prefix="notify-audit-code-", suffix=".zip")
        os.close(fd)
        with zipfile.ZipFile(name, "w", zipfile.ZIP_DEFLATED) as z:
            for pkg in ("notify",):
                spec = importlib.util.find_spec(pkg)
                assert spec is not None and spec.origin is not None
                root = Path(spec.origin).parent
                for f in sorted(root.rglob("*.py")):
                    z.write(f, str(f.relative_to(root.parent)))
        _ZIP = Path(name)
    return _ZIP


_ZIP: Path | None = None


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
