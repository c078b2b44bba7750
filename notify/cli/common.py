"""What every ``notify`` subcommand module shares: exit codes, failing with a message, the
broker's logging set-up and event loop. Kept apart from :mod:`notify.cli` so that the
command modules, loaded lazily by it, never import it back.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Final, NoReturn

import click

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


def setup_logging(level: str) -> None:
    """Log to stderr at ``level``, with the chatty libraries kept quiet (see above)."""
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


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``notify: message`` on stderr and exit with ``code``."""
    click.echo(f"notify: {message}", err=True)
    sys.exit(code)
