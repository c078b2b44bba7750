"""Fixtures of the audit tests: real broker logs (made once), corrupted copies, one Spark.

``broker_logs`` runs a real broker (notify.testing.BrokerProcess) through committed,
rolled-back, dropped-connection, XA two-phase and never-decided transactions plus plain
messages, stops it, and makes two copies of its dataPath: ``clean`` (only the APPLIED record
of one committed transaction removed from the redo log, so its check takes the COMMIT-hint
path) and ``corrupt`` with four deliberate faults: a committed message cut from its segment,
a rolled-back message's record appended to a partition, a flipped payload byte, and (with
``tx_timeout_s``) the prepared transaction left undecided. Two coordinator decision logs go
with them: one consistent, one deciding commit for a branch the broker rolled back.

``spark`` is one local[2] SparkSession for the whole session; without Java or pyspark the
tests skip, or fail when CI is set.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from notify.protocol import logrecords as lr
from notify.protocol import records
from notify.protocol.frames import encode_mput
from notify.testing import BrokerProcess
from notify.txlog.records import decode as decode_frames
from notify.txlog.records import encode as encode_frame
from tests.helpers import WireClient, crc, stats, wait_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

IN_CI = bool(os.environ.get("CI"))
HERE = Path(__file__).parent

# py4j and pyspark leave sockets to the garbage collector and use a few deprecated APIs
_FILTERS = (
    "ignore::ResourceWarning",
    "ignore::pytest.PytestUnraisableExceptionWarning",
    "ignore::DeprecationWarning:pyspark.*",
    "ignore::DeprecationWarning:py4j.*",
    "ignore::FutureWarning:pyspark.*",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            for f in _FILTERS:
                item.add_marker(pytest.mark.filterwarnings(f))


# ---------------------------------------------------------------------------- Spark


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from notify.audit.session import new_session, spark_missing

    why = spark_missing()
    if why is not None:
        if IN_CI:
            pytest.fail(f"{why} (CI is set: the audit tests must run)", pytrace=False)
        pytest.skip(why)
    # sized for tiny inputs: one shuffle partition, no whole-stage code generation
    session = new_session("local[2]", input_bytes=0, extra_conf=TEST_CONF)
    yield session
    session.stop()


#: Settings of the tests' session (on top of the product's for tiny inputs): no adaptive
#: execution (it plans each stage again as a job of its own: twice the jobs, each costing
#: more than the rows it runs on) and expressions evaluated rather than compiled (Janino
#: compiling each query's expressions costs more than evaluating them on a few rows).
#: Together about a fifth less JVM CPU per audit. The results do not depend on them; the
#: CLI test runs ``notify audit`` with the product's settings (``new_session`` sets them on
#: this session for its run) and the cluster test in a process of its own.
TEST_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


@pytest.fixture(autouse=True)
def _test_conf(request: pytest.FixtureRequest) -> None:
    """The tests' settings again before each test that uses Spark (a CLI run sets the
    product's on the shared session)."""
    if "spark" in request.fixturenames:
        session = request.getfixturevalue("spark")
        for k, v in TEST_CONF.items():
            session.conf.set(k, v)


# ---------------------------------------------------------------------------- broker logs

COORDINATOR_ID = "tm1"
BQUAL = b"broker"


@dataclass
class BrokerLogs:
    clean: Path  # a dataPath (holds transactions/)
    corrupt: Path
    coord_clean: Path
    coord_mismatch: Path
    dropped_id: int = 0  # committed, cut from drop-0
    visible_id: int = 0  # rolled back, appended to t-1
    flipped_id: int = 0  # committed, payload byte flipped in t-0
    prepared_key: str = ""  # XA, prepared, never decided
    mismatch_key: str = ""  # XA, rolled back by the broker, "commit" in coord_mismatch
    hint_key: str = ""  # committed; its APPLIED record removed from both copies
    prepared_at: float = 0.0
    keys: dict[str, str] = field(default_factory=dict)


def _gtrid(n: int) -> bytes:
    deadline = int(time.time()) + 3600
    return f"{COORDINATOR_ID}-{deadline:x}-{n:012x}".encode()


def _xa_key(gtrid: bytes) -> str:
    from notify.xa.ids import DEFAULT_FORMAT_ID

    return f"XID:{DEFAULT_FORMAT_ID}:{gtrid.hex()}:{BQUAL.hex()}:{COORDINATOR_ID}"


def _tx(c: WireClient, key: str, verb: str, extra: str = "") -> bytes:
    r = c.call(f"transaction {key} s1 {verb}{extra} 9\r\n".encode())
    assert r.code == 200, (key, verb, r.body)
    return r.body


def _tput(c: WireClient, topic: str, part: int, body: bytes, key: str) -> int:
    r = c.call(
        b"put %s %d %d 0 %d %s 1\r\n%b"
        % (topic.encode(), part, len(body), crc(body), key.encode(), body)
    )
    assert r.code == 200, r.body
    return int(r.body.split()[0])


def _mput(c: WireClient, topic: str, part: int, bodies: list[bytes], key: str) -> list[int]:
    recs = b"".join(records.encode(0, 0, b) for b in bodies)
    r = c.call(encode_mput(topic, part, recs, len(bodies), 3, key))
    assert r.code == 200, r.body
    first = int(r.body.split()[0])
    return [first + i for i in range(len(bodies))]


def _wait_rollbacks(addr: str, n: int) -> None:
    wait_until(
        lambda: stats(addr).get("tx_connection_rollbacks") == str(n),
        what="the broker's rollback of the dropped connection's transaction",
    )


def _generate(work: Path) -> tuple[Path, BrokerLogs]:
    b = BrokerProcess(
        work / "broker",
        topics={"t": 2, "drop": 1, "other": 1},
        system={"flushTxLogAtCommit": 1, "maxTxTimeoutInSeconds": 7200},
    )
    b.start()
    logs = BrokerLogs(work / "clean", work / "corrupt", work / "coord-clean", work / "coord-bad")
    try:
        with WireClient(b.addr) as c:
            for i in range(3):
                assert c.put("t", i % 2, b"plain-%d" % i).code == 200
            # committed over two partitions, one batch through mput; APPLIED removed later
            _tx(c, "TX:s1:1", "BEGIN", " 3600")
            _tput(c, "t", 0, b"c1-a", "TX:s1:1")
            _mput(c, "t", 1, [b"c1-b", b"c1-c"], "TX:s1:1")
            _tput(c, "other", 0, b"c1-d", "TX:s1:1")
            _tx(c, "TX:s1:1", "COMMIT_ONE_PHASE")
            logs.hint_key = "TX:s1:1"
            # committed, its last message will be cut from drop-0
            _tx(c, "TX:s1:2", "BEGIN", " 3600")
            _tput(c, "drop", 0, b"c2-a", "TX:s1:2")
            logs.dropped_id = _tput(c, "drop", 0, b"c2-b", "TX:s1:2")
            _tx(c, "TX:s1:2", "COMMIT_ONE_PHASE")
            # committed, one payload byte will be flipped
            _tx(c, "TX:s1:3", "BEGIN", " 3600")
            logs.flipped_id = _tput(c, "t", 0, b"c3-flip-me", "TX:s1:3")
            _tput(c, "t", 1, b"c3-b", "TX:s1:3")
            _tx(c, "TX:s1:3", "COMMIT_ONE_PHASE")
            # rolled back; its record will be appended to t-1
            _tx(c, "TX:s1:4", "BEGIN", " 3600")
            logs.visible_id = _tput(c, "t", 1, b"r4-gone", "TX:s1:4")
            _tx(c, "TX:s1:4", "ROLLBACK")
            # XA: committed two-phase; rolled back after prepare; prepared and left
            xa1, xa2, xa3 = _gtrid(1), _gtrid(2), _gtrid(3)
            for g, body in ((xa1, b"xa1"), (xa2, b"xa2"), (xa3, b"xa3")):
                k = _xa_key(g)
                _tx(c, k, "BEGIN", " 3600")
                _tput(c, "t", 0, body, k)
                _tx(c, k, "END")
                assert _tx(c, k, "PREPARE") == b"0"
            _tx(c, _xa_key(xa1), "COMMIT_TWO_PHASE")
            _tx(c, _xa_key(xa2), "ROLLBACK")
            logs.mismatch_key, logs.prepared_key = _xa_key(xa2), _xa_key(xa3)
            logs.prepared_at = time.time()
            for i in range(3, 5):
                assert c.put("t", i % 2, b"plain-%d" % i).code == 200
        with WireClient(b.addr) as c2:  # a local transaction lost with its connection
            _tx(c2, "TX:s2:1", "BEGIN", " 3600")
            _tput(c2, "t", 0, b"lost", "TX:s2:1")
        _wait_rollbacks(b.addr, 1)
    finally:
        b.stop()
    _coordinator_logs(logs, xa1, xa2)
    return b.data_dir, logs


def _coordinator_logs(logs: BrokerLogs, committed: bytes, rolled_back: bytes) -> None:
    from notify.xa import records as xr
    from notify.xa.decisionlog import DecisionLog
    from notify.xa.ids import DEFAULT_FORMAT_ID

    def decision(g: bytes) -> xr.Decision:
        return xr.Decision(
            g,
            xr.Outcome.COMMIT,
            xr.Source.COORDINATOR,
            int(time.time() * 1000),
            0,
            DEFAULT_FORMAT_ID,
            (xr.Branch("broker", BQUAL),),
        )

    with DecisionLog.open(logs.coord_clean, COORDINATOR_ID) as dl:
        dl.decide(decision(committed))
        dl.end(committed)
    with DecisionLog.open(logs.coord_mismatch, COORDINATOR_ID) as dl:
        dl.decide(decision(committed))
        dl.end(committed)
        dl.decide(decision(rolled_back))  # the broker rolled this branch back


def _without_applied(txdir: Path, key: str) -> None:
    """Rewrite the redo file without ``key``'s APPLIED frame (frames stand alone)."""
    for f in sorted(txdir.glob("redo.*")):
        data = f.read_bytes()
        res = decode_frames(data)
        kept = [
            encode_frame(int(r.type), r.body)
            for r in res.records
            if not (r.type == lr.APPLIED and lr.key_of(r.body) == key)
        ]
        f.write_bytes(b"".join(kept) + data[res.consumed :])


def _segment_of(data: Path, topic: str, part: int) -> Path:
    return sorted((data / f"{topic}-{part}").glob("*.meta"))[-1]


def _find(path: Path, msg_id: int) -> records.Record:
    recs, _ = records.decode_all(path.read_bytes(), verify=False)
    (rec,) = [r for r in recs if r.msg_id == msg_id]
    return rec


def _corrupt(data: Path, logs: BrokerLogs) -> None:
    # 1. cut the committed message from the end of drop-0 (a record boundary: still readable)
    seg = _segment_of(data, "drop", 0)
    rec = _find(seg, logs.dropped_id)
    assert rec.offset + rec.size == seg.stat().st_size
    os.truncate(seg, rec.offset)
    # 2. make the rolled-back message visible: its exact record bytes from APPEND_MSG
    appended = None
    for f in sorted((data / "transactions").glob("redo.*")):
        for r in decode_frames(f.read_bytes()).records:
            if r.type == lr.APPEND_MSG and lr.key_of(r.body) == "TX:s1:4":
                appended = lr.AppendMsg.decode(r.body).records
    assert appended is not None
    with open(_segment_of(data, "t", 1), "ab") as fh:
        fh.write(appended)
    # 3. flip one payload byte of a committed message (length and header intact)
    seg = _segment_of(data, "t", 0)
    rec = _find(seg, logs.flipped_id)
    buf = bytearray(seg.read_bytes())
    buf[rec.offset + records.HEADER_SIZE + 3] ^= 0x20
    seg.write_bytes(bytes(buf))


@pytest.fixture(scope="session")
def broker_logs(tmp_path_factory: pytest.TempPathFactory) -> BrokerLogs:
    work = tmp_path_factory.mktemp("audit")
    data, logs = _generate(work)
    for target in (logs.clean, logs.corrupt):
        shutil.copytree(data, target)
        _without_applied(target / "transactions", logs.hint_key)
    _corrupt(logs.corrupt, logs)
    return logs


# ---------------------------------------------------------------------------- a real cluster


@dataclass
class SparkCluster:
    """A Spark standalone master and two workers on 127.0.0.1 (``url``: ``spark://...``)."""

    url: str
    web: str
    pids: list[int]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive_workers(web: str) -> int:
    try:
        with urllib.request.urlopen(f"{web}/json/", timeout=2) as r:
            return len([w for w in json.load(r).get("workers", []) if w.get("state") == "ALIVE"])
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and two workers (1 core, 1 GiB each) started with the installed
    PySpark's ``bin/spark-class``; stopped by PID. Skips without Java/PySpark unless CI."""
    from notify.audit.session import SMALL_INPUT_JAVA_OPTIONS, spark_missing

    why = spark_missing()
    if why is not None:
        if IN_CI:
            pytest.fail(f"{why} (CI is set: the cluster test must run)", pytrace=False)
        pytest.skip(why)
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    work = tmp_path_factory.mktemp("spark-cluster")
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_WORKER_DIR": str(work / "work"),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_DAEMON_JAVA_OPTS": SMALL_INPUT_JAVA_OPTIONS,
    }
    port, web_port = _free_port(), _free_port()
    url, web = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}"
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        with open(work / f"{name}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [str(spark_class), *args],
                    env=env,
                    cwd=work,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    try:
        start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(web_port),
        )
        for i in range(2):
            start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(_free_port()),
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(work / f"work{i}"),
                url,
            )
        deadline = time.monotonic() + 120
        while _alive_workers(web) < 2:
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {f.name}\n{f.read_text()[-2000:]}" for f in sorted(work.glob("*.log"))
                )
                raise RuntimeError(f"the Spark cluster did not come up:\n{logs}")
            time.sleep(0.5)
        yield SparkCluster(url, web, [p.pid for p in procs])
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
