"""Every way of stopping a consumer commits what was processed, with real processes and
real signals: SIGTERM on a ``messages()`` loop (the loop ends, nothing is redelivered),
Ctrl-C (SIGINT: at most the message in hand comes again), ``close()`` of a listener
consumer; and a subscription that was never started warns instead of saying nothing.

The consumer processes commit only when stopped (``commit_interval_s`` is an hour), so a
second run that gets none of the first run's messages again proves the stop committed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from notify.client import (
    AsyncMessageSessionFactory,
    ClientConfig,
    ConsumerConfig,
    connect,
)
from notify.errors import NotifyError, SubscriptionNotStartedWarning
from notify.testing import BrokerProcess
from tests.helpers import wait_until

FAST = ClientConfig(
    request_timeout_s=2.0, reconnect_backoff_min_s=0.02, reconnect_backoff_max_s=0.2
)
COUNT = 30

#: argv: broker address, data dir, output file, mode (iterate | listen), idle timeout.
#: Each processed message is appended to the output file (flushed) before the next.
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from notify.client import ConsumerConfig, connect

    # Ctrl-C as a terminal delivers it: a test runner may have left SIGINT ignored, which
    # children inherit
    signal.signal(signal.SIGINT, signal.default_int_handler)

    addr, data_dir, out, mode, idle = sys.argv[1:6]
    cfg = ConsumerConfig(group="stop", data_dir=data_dir, commit_interval_s=3600)
    if mode == "aiterate":  # the asyncio API
        import asyncio
        from notify.client import AsyncMessageSessionFactory

        async def main():
            async with AsyncMessageSessionFactory([addr]) as session:
                c = session.create_consumer(cfg)
                with open(out, "a") as f:
                    async for msg in c.messages("test", idle_timeout_s=float(idle)):
                        f.write(msg.data.decode() + "\\n")
                        f.flush()
                        await asyncio.sleep(0.05)
            print("loop ended", flush=True)

        asyncio.run(main())
        sys.exit(0)
    with connect([addr]) as session, open(out, "a") as f:
        c = session.create_consumer(cfg)

        def handle(msg):
            f.write(msg.data.decode() + "\\n")
            f.flush()
            time.sleep(0.05)

        if mode == "iterate":
            for msg in c.messages("test", idle_timeout_s=float(idle)):
                handle(msg)
            print("loop ended", flush=True)
        else:
            c.subscribe("test", handle).complete_subscribe()
            while not os.path.exists(out + ".close"):
                time.sleep(0.02)
            c.close()
            print("closed", flush=True)
    """
)


def _produce(addr: str) -> list[str]:
    with connect([addr], config=FAST) as s:
        p = s.create_producer()
        bodies = [f"m{i:02d}" for i in range(COUNT)]
        for b in bodies:
            p.send("test", b.encode(), key=b)
    return bodies


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _start(addr: str, tmp: Path, out: Path, mode: str, idle: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, addr, str(tmp / "consumer"), str(out), mode, str(idle)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread's stack
    )


def _first_run(addr: str, tmp: Path, mode: str, stop: signal.Signals | None) -> tuple[
    list[str], subprocess.CompletedProcess[str]
]:
    out = tmp / "run1.txt"
    with _start(addr, tmp, out, mode, 600) as proc:  # (closes the pipes however it ends)
        try:
            wait_until(lambda: len(_lines(out)) >= 5, 30, what="5 messages processed")
            if stop is None:
                (tmp / "run1.txt.close").write_text("now")
            else:
                proc.send_signal(stop)
            try:
                # the stop's waits are each bounded (commit 10 s, session close 10 + 10 s):
                # a loaded machine may need most of them
                stdout, stderr = proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)  # where it hangs, for the failure message
                _out, stacks = proc.communicate(timeout=30)
                pytest.fail(f"the consumer did not stop within 90 s:\n{stacks[-6000:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
    return _lines(out), subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _second_run(addr: str, tmp: Path) -> list[str]:
    out = tmp / "run2.txt"
    proc = _start(addr, tmp, out, "iterate", 2.0)
    _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    return _lines(out)


@pytest.mark.parametrize("mode", ["iterate", "aiterate"], ids=["blocking", "asyncio"])
def test_sigterm_ends_a_messages_loop_and_commits(
    broker: BrokerProcess, tmp_path: Path, mode: str
) -> None:
    """SIGTERM while ``for msg in consumer.messages()`` (or ``async for`` under
    ``asyncio.run``) runs: the loop ends after the message in hand, the process exits
    normally, and the next run starts right after the last processed message (no message
    twice, none lost)."""
    sent = _produce(broker.addr)
    first, done = _first_run(broker.addr, tmp_path, mode, signal.SIGTERM)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loop ended"
    assert 5 <= len(first) < COUNT
    second = _second_run(broker.addr, tmp_path)
    assert not set(first) & set(second)
    assert sorted(first + second) == sent


def test_ctrl_c_in_a_messages_loop_commits_what_was_processed(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """SIGINT (Ctrl-C) interrupts the loop with KeyboardInterrupt; everything processed
    before the message in hand is committed: at most that one message comes again."""
    sent = _produce(broker.addr)
    first, done = _first_run(broker.addr, tmp_path, "iterate", signal.SIGINT)
    assert "KeyboardInterrupt" in done.stderr
    assert 5 <= len(first) < COUNT
    second = _second_run(broker.addr, tmp_path)
    again = set(first) & set(second)
    assert len(again) <= 1, again
    assert sorted(set(first) | set(second)) == sent


def test_close_of_a_listener_consumer_commits(broker: BrokerProcess, tmp_path: Path) -> None:
    """``close()`` of a consumer whose listeners are running: they finish the message in
    hand, the offsets of every handled message are committed, the next run goes on."""
    sent = _produce(broker.addr)
    first, done = _first_run(broker.addr, tmp_path, "listen", None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "closed"
    second = _second_run(broker.addr, tmp_path)
    assert not set(first) & set(second)
    assert sorted(first + second) == sent


def test_a_subscription_never_started_warns(broker: BrokerProcess, tmp_path: Path) -> None:
    """``subscribe()`` with a listener but no ``complete_subscribe()``: closing the
    consumer (or the session) warns, naming the group and topic; a started one does not."""
    with connect([broker.addr], config=FAST) as s:
        c = s.create_consumer(ConsumerConfig(group="lazy", data_dir=tmp_path / "a"))
        c.subscribe("test", lambda m: None)
        with pytest.warns(SubscriptionNotStartedWarning, match="group lazy: test") as got:
            c.close()
        assert isinstance(got[0].message, NotifyError)  # one exception hierarchy
        started = s.create_consumer(ConsumerConfig(group="busy", data_dir=tmp_path / "b"))
        started.subscribe("test", lambda m: None).complete_subscribe()
        forgotten = s.create_consumer(ConsumerConfig(group="later", data_dir=tmp_path / "c"))
        forgotten.subscribe("single", lambda m: None)
        with pytest.warns(SubscriptionNotStartedWarning) as got:
            s.close()
    assert len(got) == 1
    text = str(got[0].message)
    assert "group later: single" in text and "busy" not in text


def test_async_shutdown_of_a_consumer_never_started_warns(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    async def main() -> None:
        async with AsyncMessageSessionFactory([broker.addr], config=FAST) as s:
            c = s.create_consumer(ConsumerConfig(group="g", data_dir=tmp_path))
            c.subscribe("test", lambda m: None)
            with pytest.warns(SubscriptionNotStartedWarning):
                await c.shutdown()

    asyncio.run(main())


SIGNAL_ELSEWHERE = textwrap.dedent(
    """
    import signal, sys, threading
    from notify.client import ConsumerConfig, connect

    signal.signal(signal.SIGINT, signal.default_int_handler)
    addr, data_dir = sys.argv[1:3]

    def elsewhere():  # the kernel may hand a process's signal to any of its threads
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    with connect([addr]) as session:
        c = session.create_consumer(ConsumerConfig(group="elsewhere", data_dir=data_dir))
        threading.Timer(1.0, elsewhere).start()
        try:
            for msg in c.messages("single", idle_timeout_s=600):
                pass
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """
)


def test_ctrl_c_received_by_another_thread_still_interrupts_the_loop(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """SIGINT delivered to a thread other than the main one (the loop's, a timer's): the
    main thread, waiting for the next message, still gets its KeyboardInterrupt at once
    (not when the 600 s wait ends)."""
    proc = subprocess.run(
        [sys.executable, "-c", SIGNAL_ELSEWHERE, broker.addr, str(tmp_path / "c")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.stdout.strip() == "interrupted", proc.stderr
