"""``notify demo``: the quickstart (:mod:`notify.cli.quickstart`), loaded lazily by the CLI."""

from __future__ import annotations

from pathlib import Path

import click

from notify.cli.common import DEFAULT_CONFIG, EXIT_USAGE, fail
from notify.cli.quickstart import run_demo
from notify.errors import ConfigError, NotifyError


@click.command("demo")
@click.option("-c", "--config", "config_path", default=DEFAULT_CONFIG, show_default=True)
def demo(config_path: str) -> None:
    """Quickstart: a broker on embedded defaults, a producer, a consumer and a transaction."""
    try:
        run_demo(Path(config_path))
    except ConfigError as e:
        fail(str(e), EXIT_USAGE)
    except NotifyError as e:
        fail(str(e))
