"""The consumer's run delivery (a fetch's messages in one loop) keeps the per-message
semantics: retries counted from the failing attempt, order, stats, duplicate window."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ConsumerConfig,
    Message,
)
from notify.testing import BrokerProcess

FAST = ClientConfig(
    request_timeout_s=2.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)


def test_failing_message_in_a_run_gets_exactly_its_retries(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    datas = [b"a", b"flaky", b"b", b"c", b"flaky2", b"d"]

    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            p = s.create_producer()
            r = await p.send_batch("single", datas)  # one fetch brings them all
            assert r.success
            attempts: Counter[bytes] = Counter()
            ok_async: list[bytes] = []
            ok_inline: list[bytes] = []

            def check(m: Message) -> None:
                attempts[m.data] += 1
                if m.data.startswith(b"flaky") and attempts[m.data] < 3:
                    raise RuntimeError("transient")

            async def alistener(m: Message) -> None:
                check(m)
                ok_async.append(m.data)

            def inline(m: Message) -> None:
                check(m)
                ok_inline.append(m.data)

            for group, listener, out, threads in (
                ("ga", alistener, ok_async, 4),
                ("gi", inline, ok_inline, 0),
            ):
                attempts.clear()
                cfg = ConsumerConfig(
                    group=group,
                    data_dir=tmp_path / group,
                    max_retries=2,
                    retry_delay_s=0.001,
                    listener_threads=threads,
                )
                c = s.create_consumer(cfg)
                c.subscribe("single", listener)
                await c.complete_subscribe()
                for _ in range(500):
                    if len(out) == len(datas):
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)  # nothing delivered twice
                st = c.stats
                await c.shutdown()
                assert out == datas, group
                assert attempts[b"flaky"] == attempts[b"flaky2"] == 3, group
                assert st.messages == st.delivered == len(datas), group
                assert st.listener_failures == 4 and st.recover_stored == 0, group
                assert len(c.fetcher.dedup) == len(datas), group

    asyncio.run(main())
