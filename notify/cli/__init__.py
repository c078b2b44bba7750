"""The ``notify`` command line: a thin layer over plain functions.

Exit codes: 0 ok, 1 runtime failure (broker unreachable, error reply), 2 usage or config error.

The package is the top layer of notify: it wires the broker, the client, the outbox, the
offset stores and the XA coordinator; nothing below it imports it. This module holds the
root group and the small broker commands (``config``, ``stats``); every other command group
lives in its own module of the package (``admin``: topics, tx, retention; ``broker``; ``db``
and offsets; ``demo``; ``dlq``; ``docs``; ``outbox``; ``queue``; ``xa``) beside the shared
pieces (``common``, ``options``, ``tables``, ``request``) and the tooling they run
(``quickstart``, ``docgen``). Command modules are imported only when run (click's documented
lazy-loading pattern): ``notify broker start`` loads the broker and not the database, XA or
audit tooling, which roughly halves a broker's start-up time.
"""

from __future__ import annotations

import importlib
import json
from typing import Final

import click
from rich.console import Console
from rich.table import Table

from notify.cli.common import DEFAULT_CONFIG, EXIT_USAGE, fail
from notify.cli.options import Security, security_options, server_option
from notify.cli.request import request
from notify.config import load_config
from notify.errors import ConfigError, NotifyError
from notify.protocol.frames import encode_line
from notify.protocol.replies import parse_stats, parse_stats_json

#: Subcommands loaded on use: name -> (module, attribute). No module listed imports this one
#: (only its sibling modules: checked by the architecture test).
LAZY_COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "audit": ("notify.audit.cli", "audit"),
    "broker": ("notify.cli.broker", "broker"),
    "db": ("notify.cli.db", "db"),
    "demo": ("notify.cli.demo", "demo"),
    "docs": ("notify.cli.docs", "docs"),
    "dlq": ("notify.cli.dlq", "dlq"),
    "offsets": ("notify.cli.db", "offsets"),
    "outbox": ("notify.cli.outbox", "outbox"),
    "queue": ("notify.cli.queue", "queue"),
    "retention": ("notify.cli.admin", "retention"),
    "topics": ("notify.cli.admin", "topics"),
    "tx": ("notify.cli.admin", "tx"),
    "xa": ("notify.cli.xa", "xa"),
}


class LazyGroup(click.Group):
    """A group whose :data:`LAZY_COMMANDS` are imported when first looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY_COMMANDS and cmd_name not in self.commands:
            module, attr = LAZY_COMMANDS[cmd_name]
            cmd = getattr(importlib.import_module(module), attr)
            if not isinstance(cmd, click.Command):  # pragma: no cover - table is checked
                raise TypeError(f"{module}.{attr} is not a click command")
            self.add_command(cmd, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup)
@click.version_option(package_name="notify")
def main() -> None:
    """notify: transactional messaging in the line of MetaQ and Notify."""


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
        fail(str(e), EXIT_USAGE)
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
        fail(str(e))
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
        fail(str(e))
    pairs = parse_stats(body)
    if as_json:  # numbers, booleans, and k=v fields as objects
        click.echo(json.dumps(parse_stats_json(body), indent=2))
    else:
        table = Table(title=f"stats {item}".strip())
        table.add_column("key")
        table.add_column("value")
        for k, v in pairs:
            table.add_row(k, v)
        Console().print(table)
    code = dict(pairs).get("resultCode", "0")
    if code != "0":  # MetaQ answers an unknown item as a topic: 200 with resultCode 1
        fail(f"stats {item}: no such topic or item (resultCode {code}); "
             "notify stats help lists the items")
