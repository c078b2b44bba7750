"""A consumer process killed inside its listener: redelivery from the committed offset."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from notify.client import ClientConfig, ConsumerConfig, Message, connect
from notify.testing import BrokerProcess
from tests.helpers import wait_until

CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from notify.client import ConsumerConfig, connect

    addr, data_dir, log = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    seen = 0
    out = open(log, "a")

    def listener(m):
        global seen
        seen += 1
        out.write(m.data.decode() + "\\n")
        out.flush()
        if seen == 60:
            time.sleep(0.4)  # let a periodic commit happen, then die mid-stream
        if seen == 75:
            os.kill(os.getpid(), signal.SIGKILL)

    s = connect([addr])
    c = s.create_consumer(ConsumerConfig(group="crashy", data_dir=data_dir,
                                         commit_interval_s=0.1))
    c.subscribe("single", listener).complete_subscribe()
    time.sleep(30)
    """
)


@pytest.mark.crash
def test_killed_consumer_resumes_from_committed_offset(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    total = 100
    log = tmp_path / "processed.txt"
    with connect([broker.addr]) as s:
        p = s.create_producer()
        for i in range(total):
            assert p.send("single", b"%d" % i).success
        child = subprocess.run(
            [sys.executable, "-c", CHILD, broker.addr, str(tmp_path / "c"), str(log)],
            timeout=60,
            check=False,
        )
        assert child.returncode == -9
        before = [int(x) for x in log.read_text().split()]
        assert before == list(range(75))
        got: list[int] = []

        def listener(m: Message) -> None:
            got.append(int(m.data))

        cfg = ConsumerConfig(group="crashy", data_dir=tmp_path / "c", commit_interval_s=0.1)
        c = s.create_consumer(cfg)
        c.subscribe("single", listener).complete_subscribe()
        wait_until(lambda: got[-1:] == [total - 1])
        c.shutdown()
    # nothing lost; what was processed after the last commit is delivered again
    assert got == list(range(got[0], total))
    assert 0 < got[0] <= 74  # usually 59: being handled when the last commit ran
    assert set(before) | set(got) == set(range(total))
    assert ClientConfig().request_timeout_s > 0
