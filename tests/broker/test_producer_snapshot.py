"""The idempotent producers' snapshot (``producer-states.json``) is written by one thread at
a time: a periodic write whose awaiter is cancelled (the broker stopping) goes on in its
thread, and the write at stop waits for it instead of racing it on the temporary file (seen
as "cannot save the idempotent producers' state: No such file or directory")."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

from notify.broker.app import Broker
from notify.broker.idempotence import SNAPSHOT_FILE, ProducerStates
from notify.config import load_config
from notify.testing import free_port, render_ini


def test_a_cancelled_snapshot_write_is_waited_for(tmp_path: Path) -> None:
    ini = tmp_path / "server.ini"
    ini.write_text(render_ini(tmp_path / "data", free_port(), {"t": 1}))
    inside = 0
    most = 0
    lock = threading.Lock()
    real_save = ProducerStates.save

    def slow_save(self: ProducerStates, data_dir: Path, snapshot: bytes) -> None:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            time.sleep(0.3)  # a slow disk: long enough for the stop to come meanwhile
            real_save(self, data_dir, snapshot)
        finally:
            with lock:
                inside -= 1

    async def run() -> None:
        broker = Broker(load_config(ini))
        await broker.start()
        try:
            assert broker.service is not None
            broker.service.producers.save = slow_save.__get__(broker.service.producers)  # type: ignore[method-assign]
            first = asyncio.ensure_future(broker._save_producer_states())
            await asyncio.sleep(0.05)
            first.cancel()  # as stop() cancels the ticker in the middle of its write
        finally:
            await broker.stop()  # writes the snapshot again

    asyncio.run(run())
    assert most == 1  # never two writers at once
    doc = json.loads((tmp_path / "data" / SNAPSHOT_FILE).read_bytes())
    assert isinstance(doc, dict) and "partitions" in doc
    assert not list((tmp_path / "data").glob("*.tmp"))
