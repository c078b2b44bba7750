"""The ``notify`` command line: a thin layer over plain functions.

Exit codes: 0 ok, 1 runtime failure (broker unreachable, error reply), 2 usage or config error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Final

import click
from rich.console import Console
from rich.table import Table

from notify.admin import request
from notify.audit.cli import audit as _audit
from notify.broker.app import Broker
from notify.cli_admin import register as _register_admin
from notify.cli_db import db as _db
from notify.cli_db import offsets as _offsets
from notify.cli_options import Security, security_options, server_option
from notify.cli_queue import queue as _queue
from notify.cli_tx import xa as _xa
from notify.config import ServerConfig, load_config
from notify.demo import run_demo
from notify.errors import ConfigError, NotifyError
from notify.protocol.frames import encode_line
from notify.protocol.replies import parse_stats, parse_stats_json

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
DEFAULT_CONFIG: Final = "conf/server.ini"


#: Chatty libraries kept at WARNING unless ``--log-level debug`` (APScheduler logs every job
#: run at INFO: about ten lines a second on an idle broker).
QUIET_LOGGERS: Final = ("apscheduler", "aiohttp.access")


#: APScheduler's warnings that only say a periodic job ran late or overlapped itself (it
#: coalesces and runs again at the next tick): chatter, not a problem, below debug level.
SCHEDULER_CHATTER: Final = ("Execution of job", "Run time of job")


class _SchedulerChatter(logging.Filter):
    """Drops :data:`SCHEDULER_CHATTER` records; job failures (ERROR) still pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not str(record.msg).startswith(
            SCHEDULER_CHATTER
        )


def _setup_logging(level: str) -> None:
    lvl = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=lvl, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if lvl > logging.DEBUG:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(max(lvl, logging.WARNING))
        for name in ("apscheduler.scheduler", "apscheduler.executors.default"):
            logging.getLogger(name).addFilter(_SchedulerChatter())


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed, the stdlib loop otherwise."""
    try:
        import uvloop  # optional dependency (not on every platform): only where it is used

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


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


def _fail(message: str, code: int = EXIT_FAILURE) -> None:
    click.echo(f"notify: {message}", err=True)
    sys.exit(code)


@click.group()
@click.version_option(package_name="notify")
def main() -> None:
    """notify: transactional messaging in the line of MetaQ and Notify."""


@main.group()
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
    _setup_logging(log_level)
    try:
        config = load_config(config_path)
    except ConfigError as e:
        _fail(str(e), EXIT_USAGE)

    def ready(b: Any) -> None:
        if ready_file:
            tmp = Path(ready_file + ".tmp")
            tmp.write_text(json.dumps({"host": b.host, "port": b.port, "pid": os.getpid()}))
            tmp.replace(ready_file)

    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            runner.run(serve(config, ready))
    except NotifyError as e:
        _fail(str(e))
    except OSError as e:
        _fail(f"cannot start broker: {e}")


@main.group()
def config() -> None:
    """Check or reload server.ini."""


@config.command("check")
@click.option("-c", "--config", "config_path", default=DEFAULT_CONFIG, show_default=True)
def config_check(config_path: str) -> None:
    """Parse server.ini and print the topics it defines."""
    try:
        cfg = load_config(config_path)
    except ConfigError as e:
        _fail(str(e), EXIT_USAGE)
    click.echo(f"{config_path}: ok; dataPath={cfg.system.data_path}")
    for t in cfg.topics.values():
        click.echo(f"  topic {t.name}: {t.num_partitions} partitions")


@config.command("reload")
@server_option
@security_options
def config_reload(server: str, security: Security) -> None:
    """Ask a running broker to re-read its server.ini."""
    try:
        reply = request(server, lambda o: encode_line("reload", o), security.transport())
    except NotifyError as e:
        _fail(str(e))
    click.echo(reply.body.decode())


@main.command("stats")
@click.argument("item", required=False, default="")
@server_option
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@security_options
def stats(item: str, server: str, as_json: bool, security: Security) -> None:
    """Show a broker's stats (items: topics, offsets, realtime, config, reset, <topic>)."""
    tokens = ("stats", item) if item else ("stats",)
    try:
        body = request(server, lambda o: encode_line(*tokens, o), security.transport()).body
    except NotifyError as e:
        _fail(str(e))
    if as_json:  # numbers, booleans, and k=v fields as objects
        click.echo(json.dumps(parse_stats_json(body), indent=2))
        return
    pairs = parse_stats(body)
    table = Table(title=f"stats {item}".strip())
    table.add_column("key")
    table.add_column("value")
    for k, v in pairs:
        table.add_row(k, v)
    Console().print(table)


@main.command("demo")
@click.option("-c", "--config", "config_path", default=DEFAULT_CONFIG, show_default=True)
def demo(config_path: str) -> None:
    """Quickstart: a broker on embedded defaults, a producer, a consumer and a transaction."""
    try:
        run_demo(Path(config_path))
    except ConfigError as e:
        _fail(str(e), EXIT_USAGE)
    except NotifyError as e:
        _fail(str(e))


main.add_command(_db)
main.add_command(_offsets)
_register_admin(main)
main.add_command(_xa)
main.add_command(_audit)
main.add_command(_queue)
