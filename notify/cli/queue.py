"""``notify queue``: queue groups on a running broker (README "Queues").

    notify queue delete TOPIC GROUP [--force] [--json]

A queue group's dead letters are ``notify dlq list|replay TOPIC GROUP`` (:mod:`notify.cli.dlq`;
the older ``notify queue dlq ...`` still works, hidden). It talks to the broker's wire port
(``-s host:port``) with the ``qdel`` verb; when the broker sets ``adminSecret`` it needs it
(``--secret`` / ``NOTIFY_SECRET``). TLS options as for every command
(:mod:`notify.cli.options`). Exit codes: 0 ok, 1 runtime failure (broker unreachable, error
reply), 2 usage error.
"""

from __future__ import annotations

import json
import sys
from typing import Final, NoReturn

import click

from notify.cli.dlq import dlq_list, dlq_replay
from notify.cli.options import Security, security_options, server_option
from notify.cli.request import request
from notify.errors import NotifyError
from notify.protocol.frames import encode_qdel

EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"notify: {message}", err=True)
    sys.exit(code)


@click.group()
def queue() -> None:
    """Queue groups (push delivery with per-message acknowledgement)."""


@queue.group("dlq", hidden=True)
def dlq() -> None:
    """Deprecated: ``notify dlq list|replay TOPIC GROUP``."""


dlq.add_command(dlq_list, "list")
dlq.add_command(dlq_replay, "replay")

_SERVER = server_option  # -s/--server, env NOTIFY_SERVER, like every wire command
_JSON = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


@queue.command("delete")
@click.argument("topic")
@click.argument("group")
@click.option("--force", is_flag=True,
              help="also when it has consumers (their connections are closed)")
@_SERVER
@_JSON
@security_options
def delete(
    topic: str, group: str, force: bool, server: str, as_json: bool, security: Security
) -> None:
    """Delete queue GROUP of TOPIC and its state (positions, dead letters): its messages
    stay in the topic; a later subscription creates the group anew."""
    try:
        request(server, lambda o: encode_qdel(topic, group, force, o), security.transport())
    except NotifyError as e:
        _fail(str(e))
    if as_json:
        click.echo(json.dumps({"topic": topic, "group": group, "deleted": True}))
        return
    click.echo(f"{topic}/{group}: deleted")
