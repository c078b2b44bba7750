"""/metrics in Prometheus' text format, read from the live broker."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient
from tests.http.conftest import Http, prepare_xa, xid


def scrape(http: Http) -> dict[str, list[Sample]]:
    r = http.get("/metrics")
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=")
    out: dict[str, list[Sample]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(m: dict[str, list[Sample]], name: str, **labels: str) -> float:
    for s in m.get(name, []):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError(f"{name}{labels} not in metrics")


def test_counters_follow_traffic(http_broker: BrokerProcess, http: Http) -> None:
    m0 = scrape(http)
    before = value(m0, "notify_put_messages_total", topic="gc")
    fsyncs0 = value(m0, "notify_fsyncs_total")
    hist0 = value(m0, "notify_fsync_seconds_count")
    r = http.post("/api/topics/gc/messages", json_body=[{"text": "x" * 10, "partition": 1}] * 5)
    assert r.status == 200
    with WireClient(http_broker.addr) as c:
        assert c.call(b"get gc metricsgroup 1 0 1024 1\r\n").code == 200
    m = scrape(http)
    assert value(m, "notify_put_messages_total", topic="gc") == before + 5
    assert value(m, "notify_put_bytes_total", topic="gc") >= 50
    assert value(m, "notify_commands_total", command="put") >= 5
    assert value(m, "notify_get_requests_total", topic="gc") >= 1
    # group commit topic: fsynced before the reply, observed by the histogram
    assert value(m, "notify_fsyncs_total") > fsyncs0
    assert value(m, "notify_fsync_seconds_count") > hist0
    assert value(m, "notify_fsync_seconds_bucket", le="+Inf") == value(
        m, "notify_fsync_seconds_count"
    )
    end = value(m, "notify_partition_max_offset", topic="gc", partition="1")
    assert end > 0
    assert (
        value(m, "notify_consumer_lag_bytes", group="metricsgroup", topic="gc", partition="1")
        == end
    )
    assert value(m, "notify_build_info", broker_id="0") == 1
    assert not any(name.startswith("notify_replication") for name in m)


def test_transactions_by_state(http_broker: BrokerProcess, http: Http) -> None:
    prepare_xa(http_broker.addr, xid(501), "test", 0, [b"m"])
    m = scrape(http)
    assert value(m, "notify_transactions", state="PREPARED") >= 1
    assert value(m, "notify_transaction_outcomes_total", outcome="begun") >= 1
    assert http.post(f"/api/transactions/{xid(501)}/rollback").status == 200
    m = scrape(http)
    assert value(m, "notify_transactions", state="PREPARED") == 0


def test_replication_metrics_only_where_measured(
    tmp_path: Path, http_broker: BrokerProcess, http: Http
) -> None:
    plain = scrape(http)
    assert value(plain, "notify_role", role="master") == 1
    assert not any(n.startswith(("notify_replication", "notify_sync_slave")) for n in plain)
    master = BrokerProcess(
        tmp_path / "m", topics={"rep": 2}, system={"replicationSecret": "rs"}
    ).start()
    try:
        slave = BrokerProcess(
            tmp_path / "s",
            topics={"rep": 2},
            system={"dashboardHttpPort": free_port(), "replicationSecret": "rs"},
            slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 100},
        ).start()
        try:
            with WireClient(master.addr) as c:
                for i in range(5):
                    assert c.put("rep", i % 2, b"r%d" % i).code == 200
            sh = Http(slave.http_url)
            deadline = time.monotonic() + 15
            while True:
                m = scrape(sh)
                lags = [
                    s
                    for s in m.get("notify_replication_lag_bytes", [])
                    if s.labels["topic"] == "rep"
                ]
                if len(lags) == 2 and all(s.value == 0 for s in lags):
                    break
                assert time.monotonic() < deadline, lags
                time.sleep(0.1)
            assert value(m, "notify_role", role="slave") == 1
            assert (
                value(m, "notify_replication_last_pull_age_seconds", topic="rep", partition="0")
                < 10
            )
            rep = sh.get("/api/overview").json()["system"]["replication"]
            assert rep["role"] == "slave" and rep["master"] == master.addr
            assert {p["partition"] for p in rep["partitions"] if p["topic"] == "rep"} == {0, 1}
        finally:
            slave.stop()
    finally:
        master.stop()
