"""A consumer-group member in its own process, for the cluster tests.

    python -m tests.cluster.consumer_worker ZK_URL GROUP TOPIC OUT_FILE DATA_DIR NAME

Appends one line per delivered message to OUT_FILE: ``<name> <partition> <offset> <payload>``
(written and flushed before the listener returns, so a SIGKILL loses no line of a message
whose offset could have been committed). SIGTERM: graceful shutdown (commit, release the
partitions, leave the group), exit 0.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from notify.client import ClientConfig, ConsumerConfig, Message, connect

SESSION_S = 2.0


def main(argv: list[str]) -> int:
    zk_url, group, topic, out_file, data_dir, name = argv[:6]
    broadcast = "--broadcast" in argv
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lock = threading.Lock()
    out = open(out_file, "a", buffering=1)  # noqa: SIM115 - closed below

    def on_message(m: Message) -> None:
        line = f"{name} {m.partition} {m.offset} {m.data.decode()}\n"
        with lock:
            out.write(line)
            out.flush()

    cfg = ClientConfig(zk_session_timeout_s=SESSION_S, use_uvloop=True)
    with connect(zk=zk_url, config=cfg) as session:
        consumer = session.create_consumer(
            ConsumerConfig(
                group=group,
                data_dir=Path(data_dir),
                commit_interval_s=0.5,
                long_poll_ms=200,
                listener_threads=1,
                broadcast=broadcast,
                instance_id=name if broadcast else None,
                rebalance_retry_max_s=0.5,
            )
        )
        consumer.subscribe(topic, on_message).complete_subscribe()
        print("ready", flush=True)
        stop.wait()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
