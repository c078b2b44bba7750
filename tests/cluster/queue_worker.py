"""A queue consumer in its own process that never acknowledges, for the cluster tests.

    python -m tests.cluster.queue_worker ZK_URL TOPIC GROUP CREDIT OUT_FILE

Appends ``<partition> <offset>`` per pushed message to OUT_FILE (flushed at once) and holds
every message (no ack): what it holds goes to others only when a broker drops it. Prints
``ready`` once subscribed; SIGTERM ends it.
"""

from __future__ import annotations

import signal
import sys
import threading

from notify.client import ClientConfig, connect

SESSION_S = 2.0


def main(argv: list[str]) -> int:
    zk_url, topic, group, credit, out_file = argv[:5]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cfg = ClientConfig(zk_session_timeout_s=SESSION_S)
    with open(out_file, "a", buffering=1) as out, connect(zk=zk_url, config=cfg) as session:
        consumer = session.create_queue_consumer(topic, group, credit=int(credit))
        print("ready", flush=True)
        while not stop.is_set():
            msg = consumer.get(0.1)
            if msg is not None:
                out.write(f"{msg.partition} {msg.offset}\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
