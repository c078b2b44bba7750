"""Consumer control against a real broker: concurrent polling and ``idle_timeout_s`` of
``messages()``, ``seek`` (offset, time), ``pause``/``resume``, blocking ``run()`` with a clean
shutdown on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from notify.client import ClientConfig, ConsumerConfig, FileOffsetStore, Message, connect
from notify.testing import BrokerProcess
from tests.helpers import timing, wait_until

FAST = ClientConfig(
    request_timeout_s=2.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


def cconf(tmp_path: Path, group: str = "g", **kw: Any) -> ConsumerConfig:
    kw.setdefault("commit_interval_s", 0.2)
    return ConsumerConfig(group=group, data_dir=tmp_path / "consumer", **kw)


def test_messages_polls_partitions_concurrently_and_honours_idle_timeout(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    with connect([broker.addr], config=FAST) as s:
        c = s.create_consumer(cconf(tmp_path))
        for timeout in (0.3, 0.6):
            t0 = time.monotonic()
            assert list(c.messages("test", idle_timeout_s=timeout)) == []
            took = time.monotonic() - t0
            assert timeout <= took, took
            timing(took < timeout + 0.25, f"idle_timeout_s={timeout} ended after {took:.2f} s")
        p = s.create_producer()
        lat: list[float] = []
        sent: dict[bytes, float] = {}

        def produce() -> None:
            time.sleep(0.2)
            for i in range(12):  # by key: partitions in an order the iterator cannot guess
                body = b"m%d" % i
                sent[body] = time.monotonic()
                p.send("test", body, key=f"k{i}")
                time.sleep(0.05)

        t = threading.Thread(target=produce)
        t.start()
        for m in c.messages("test", idle_timeout_s=2.0):
            lat.append(time.monotonic() - sent[m.data])
            if len(lat) == 12:
                break
        t.join()
        # a long poll held on one partition no longer delays the others (was up to 1 s)
        assert max(lat) < 0.3, lat


def test_messages_counts_only_what_was_handed_out(broker: BrokerProcess, tmp_path: Path) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        for i in range(10):
            p.send("single", b"%d" % i).raise_for_error()
        c = s.create_consumer(cconf(tmp_path, commit_interval_s=0))
        got = []
        for m in c.messages("single", idle_timeout_s=1.0):
            got.append(m)
            if len(got) == 3:
                break  # the 3rd is not processed: the next was never asked for
        c.commit()
        store = FileOffsetStore(tmp_path / "consumer" / "offsets")
        stored = store.load("g", "single", str(got[0].partition))
        assert stored is not None and stored.offset == got[1].next_offset
        c.shutdown()
        c2 = s.create_consumer(cconf(tmp_path, commit_interval_s=0))
        again = [m.data for m in c2.messages("single", idle_timeout_s=2.0)]
        assert again == [b"%d" % i for i in range(2, 10)]


def test_seek_to_offset_and_to_time(broker: BrokerProcess, tmp_path: Path) -> None:
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        first = [p.send("single", b"a%d" % i).raise_for_error() for i in range(5)]
        time.sleep(0.05)
        middle = time.time()
        time.sleep(0.05)
        second = [p.send("single", b"b%d" % i).raise_for_error() for i in range(5)]
        c = s.create_consumer(cconf(tmp_path, initial_offset="latest"))
        assert list(c.messages("single", idle_timeout_s=0.3)) == []  # starts at the end
        assert c.seek("single", offset="earliest") == {"0-0": 0}
        data = [m.data for m in c.messages("single", idle_timeout_s=1.5)]
        assert data == [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)]
        assert c.seek("single", timestamp=middle) == {"0-0": second[0].offset}
        later = [m.data for m in c.messages("single", idle_timeout_s=1.5)]
        assert later == [b"b%d" % i for i in range(5)]
        c.seek("single", "0-0", offset=first[3].offset)
        assert [m.data for m in c.messages("single", idle_timeout_s=1.5)][:2] == [b"a3", b"a4"]
        assert c.seek("single", timestamp=time.time() + 60) == {"0-0": second[-1].offset + 22}
        assert c.seek("single", offset="latest") == {"0-0": second[-1].offset + 22}
        # a listener consumer: seek before the start is committed, after it moves the cursor
        got: list[Message] = []
        lc = s.create_consumer(cconf(tmp_path, group="lg"))
        lc.subscribe("single", got.append)
        lc.seek("single", timestamp=middle)
        lc.complete_subscribe()
        wait_until(lambda: len(got) == 5)
        assert [m.data for m in got] == [b"b%d" % i for i in range(5)]
        lc.seek("single", offset=first[4].offset)
        wait_until(lambda: len(got) == 11)
        assert [m.data for m in got[5:]] == [b"a4"] + [b"b%d" % i for i in range(5)]


def test_pause_and_resume_one_partition(broker: BrokerProcess, tmp_path: Path) -> None:
    with connect([broker.addr], config=FAST) as s:
        got: list[Message] = []
        c = s.create_consumer(cconf(tmp_path))
        c.subscribe("test", got.append).complete_subscribe()
        c.pause("test", "0-2")
        assert c.paused() == ["0-2"]
        p = s.create_producer()
        for i in range(40):
            p.send("test", b"%d" % i, key=f"k{i}").raise_for_error()
        p.send("test", b"x", key="k1").raise_for_error()
        wait_until(lambda: len({str(m.partition) for m in got}) == 3)
        time.sleep(0.3)
        assert "0-2" not in {str(m.partition) for m in got}
        n = len(got)
        c.resume("test", "0-2")
        assert c.paused() == []
        wait_until(lambda: len(got) == 41)
        assert {str(m.partition) for m in got[n:]} == {"0-2"}
        # the pull API too
        pc = s.create_consumer(cconf(tmp_path, group="pull"))
        assert len(list(pc.messages("test", idle_timeout_s=2.0))) == 41
        pc.seek("test", offset="earliest")
        pc.pause("test", ["0-0", "0-1", "0-3"])
        assert {str(m.partition) for m in pc.messages("test", idle_timeout_s=2.0)} == {"0-2"}


RUNNER = textwrap.dedent(
    """
    import sys, time
    from notify.client import ConsumerConfig, connect

    def handle(msg):
        print("got", msg.data.decode(), flush=True)

    with connect([sys.argv[1]]) as session:
        c = session.create_consumer(
            ConsumerConfig(group="svc", data_dir=sys.argv[2], commit_interval_s=60)
        )
        c.subscribe("single", handle)
        print("running", flush=True)
        c.run()
        print("stopped", flush=True)
    """
)


def test_run_blocks_until_sigterm_then_commits(broker: BrokerProcess, tmp_path: Path) -> None:
    script = tmp_path / "svc.py"
    script.write_text(RUNNER)
    with connect([broker.addr], config=FAST) as s:
        p = s.create_producer()
        sent = [p.send("single", b"m%d" % i).raise_for_error() for i in range(3)]
    proc = subprocess.Popen(
        [sys.executable, str(script), broker.addr, str(tmp_path / "svc")],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.strip() == "got m2":
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert lines[0] == "running" and out.strip().endswith("stopped")
    # the commit interval is 60 s: the offsets are there because the shutdown committed
    stored = FileOffsetStore(tmp_path / "svc" / "offsets").load("svc", "single", "0-0")
    assert stored is not None and stored.offset == sent[-1].offset + 22
