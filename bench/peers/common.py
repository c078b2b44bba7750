"""What every scenario returns, and the small helpers the drivers share."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: body size of every message in every system (the raw fsync test appends 100 B too)
SIZE = 100
BODY = b"m" * SIZE

# durability classes: rows are compared only within one class
SYNC = "fsync before ack"
WINDOW = "loss window"
NONE = "-"

# shapes: rows are compared only within one shape
SYNC1 = "1 client, 1 msg in flight"
SYNC10 = "10 clients, 1 msg in flight each"
BATCH = "1 client, batches of 100"
STREAM = "1 client, pipelined stream"
TX1 = "1 client, 1 msg/tx"
TX10 = "1 client, 10 msg/tx"
TXC1 = "10 clients, 1 msg/tx"
TXC10 = "10 clients, 10 msg/tx"
CONSUME = "1 consumer, acked"

TX_SHAPES = {TX1: (1, 1), TX10: (1, 10), TXC1: (10, 1), TXC10: (10, 10)}


@dataclass
class Result:
    system: str
    mode: str
    durability: str
    shape: str
    msgs: int
    seconds: float
    txs: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, per op
    server_cpu: float = 0.0  # seconds of server CPU during the scenario
    client_cpu: float = 0.0  # seconds of this (load generating) process's CPU
    library: bool = True  # driven through a client library (False: notify's wire driver)
    note: str = ""

    @property
    def msg_rate(self) -> float:
        return self.msgs / self.seconds if self.seconds > 0 else 0.0

    @property
    def tx_rate(self) -> float:
        return self.txs / self.seconds if self.seconds > 0 else 0.0

    @property
    def rate(self) -> float:
        """The figure rows are compared by: tx/s for transactions, msg/s otherwise."""
        return self.tx_rate if self.shape in TX_SHAPES else self.msg_rate

    def pct(self, q: float) -> float | None:
        if not self.latencies:
            return None
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(len(lat) * q))] * 1000.0

    @property
    def cpu_us_per_msg(self) -> float | None:
        if not self.msgs or self.server_cpu <= 0:
            return None
        return self.server_cpu / self.msgs * 1e6

    @property
    def client_cpu_us_per_msg(self) -> float | None:
        if not self.msgs or self.client_cpu <= 0:
            return None
        return self.client_cpu / self.msgs * 1e6


@dataclass
class Budget:
    """Per-scenario duration and the counts that follow from it (--quick shrinks both)."""

    seconds: float
    quick: bool

    def deadline(self) -> float:
        return time.perf_counter() + self.seconds
