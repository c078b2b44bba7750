"""``notify broker start``: run a broker in the foreground.

Loaded by :mod:`notify.cli` only for this command, so starting a broker imports the broker
and nothing of the database, XA or audit commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import click

from notify.broker.app import Broker
from notify.cli.common import DEFAULT_CONFIG, EXIT_USAGE, fail, new_event_loop, setup_logging
from notify.config import ServerConfig, load_config
from notify.errors import ConfigError, NotifyError


async def serve(config: ServerConfig, ready: Any = None) -> None:
    """Run a broker until SIGTERM/SIGINT (or until the task is cancelled)."""
    broker = Broker(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # handlers first: a SIGTERM during start-up (recovery can take a while) stops the broker
    # cleanly once it is up, deregistering it, instead of killing it half-registered
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    try:
        while True:
            await broker.start()
            if ready is not None and not stop.is_set():
                ready(broker)
                ready = None
            if broker.failover is None:
                await stop.wait()
                break
            # automatic failover: a replaced master (or a slave of a replaced master) starts
            # again in this process and joins the new epoch as a slave
            waits = [asyncio.ensure_future(e.wait()) for e in (stop, broker.failover.rejoin)]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if stop.is_set():
                break
            await broker.stop()
            broker = Broker(config)
    finally:
        await broker.stop()



@click.group()
def broker() -> None:
    """Run the broker."""


@broker.command("start")
@click.option("-c", "--config", "config_path", default=DEFAULT_CONFIG, show_default=True)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="info: start-up, shutdown, warnings and errors (periodic jobs stay silent); "
    "debug: everything, the scheduler's job runs and HTTP access log included",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="write {host, port, pid} as JSON here once listening (for scripts and tests)",
)
def broker_start(config_path: str, log_level: str, ready_file: str | None) -> None:
    """Start a broker in the foreground (SIGTERM/Ctrl-C stops it cleanly, SIGHUP reloads)."""
    setup_logging(log_level)
    try:
        config = load_config(config_path)
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)

    def ready(b: Any) -> None:
        if ready_file:
            tmp = Path(ready_file + ".tmp")
            tmp.write_text(json.dumps({"host": b.host, "port": b.port, "pid": os.getpid()}))
            tmp.replace(ready_file)

    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(serve(config, ready))
    except NotifyError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot start broker: {e}")
