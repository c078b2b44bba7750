"""Queue-subscription state follows replication. The queue log (DONE,
DELIVER, GROUP records and the checkpoints' SNAPSHOT records) travels to the slave as the
``__queuelog`` stream; with a synchronous slave an acknowledgement is answered only once the
slave has it. After ``kill -9`` of the master and ``promote``, no accepted message is
delivered again and the ones in flight come back (at-least-once).

Real broker processes; the master dies by SIGKILL.
"""

from __future__ import annotations

import time
from pathlib import Path

from notify.testing import BrokerProcess, free_port
from tests.helpers import WireClient, stats
from tests.queues.test_queues import _publish, _pushes
from tests.replication.test_tx_failover import REPL, _wait


def test_promoted_slave_does_not_redeliver_accepted_messages(tmp_path: Path) -> None:
    system = {"replicationSecret": REPL, "queueLockTimeout": 2000, "queueCheckpointInterval": 300}
    master = BrokerProcess(tmp_path / "m", topics={"work": 2}, system=system)
    master.port = free_port()
    slave = BrokerProcess(
        tmp_path / "s",
        topics={"work": 2},
        system=system,
        slave={"slaveId": 1, "masterAddress": master.addr, "slaveMaxDelayInMills": 100},
    )
    slave.start()
    master.system.update({"syncSlave": slave.addr, "syncSlaveTimeout": 3000})
    master.start()
    try:
        _wait(lambda: stats(master.addr).get("sync_slave_connected") == "True", what="link")
        _publish(master.addr, "work", 100, 2)
        c = WireClient(master.addr)
        assert c.call(b"qsub work g 20 earliest 1\r\n").code == 200
        accepted: set[tuple[int, int]] = set()
        msgs = _pushes(c, 20)
        opaque = 10
        while len(accepted) < 60:
            items = b"".join(b"A %d %d\n" % (m.partition, m.offset) for m in msgs)
            opaque += 1
            c.send(b"qack work g %d %d\r\n" % (len(items), opaque) + items)
            out = c.replies(21)  # the answer (durable and on the slave) and 20 new pushes
            (rep,) = [r for r in out if r.kind == "result"]
            assert rep.code == 200 and rep.body.split(b"\n")[0] == b"20 0", rep
            accepted |= {(m.partition, m.offset) for m in msgs}
            msgs = [r for r in out if r.kind == "qmsg"]
            if len(accepted) == 20:
                time.sleep(0.6)  # a checkpoint (SNAPSHOT records) travels too
        held = {(m.partition, m.offset) for m in msgs}  # acquired, not accepted
        master.kill()
        c.close()
        with WireClient(slave.addr) as a:
            assert a.call(b"qsub work g 100 earliest 1\r\n").code == 403  # a slave serves none
            assert a.call(b"promote 2\r\n").code == 200
        with WireClient(slave.addr) as c2:
            assert c2.call(b"qsub work g 100 earliest 1\r\n").code == 200
            got = {(m.partition, m.offset) for m in _pushes(c2, 40)}
            assert not got & accepted  # no accepted message is delivered again
            assert held <= got  # the ones in flight at the crash come back
            assert len(got | accepted) == 100  # none lost
            r = c2.call(b"version 3\r\n")  # nothing else was pushed before this answer
            assert r.kind == "result" and r.code == 200, r
    finally:
        master.kill()
        slave.stop()
