"""Admin commands of the ``notify`` CLI: topics, in-doubt transactions, retention.

Registered on the main group by :func:`register` (called at the end of :mod:`notify.cli`)::

    notify topics list | describe NAME | create NAME [-p N] [--set key=value ...]
    notify tx list [--in-doubt] | commit KEY | rollback KEY
    notify retention run TOPIC

Broker commands name the broker with ``-s/--server`` like every command (its wire address,
default ``127.0.0.1:8123``, env ``NOTIFY_SERVER``; the HTTP port is asked from it, or give the
HTTP URL itself; ``--secret`` / ``NOTIFY_SECRET`` when the broker sets ``authSecret``;
``--tls-ca-file`` etc., see :mod:`notify.cli.options`). ``topics``, ``tx list`` and
``retention`` call the HTTP admin API; ``tx commit|rollback`` use the wire ``transaction``
command (or the HTTP API when ``-s`` is a URL). ``dlq`` is in :mod:`notify.cli.dlq`.
Tables for people by default, ``--json`` for scripts.

Exit codes: 0 ok, 1 runtime failure (broker unreachable, error reply), 2 usage error.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, Final, NoReturn, TypeVar

import click
from rich.console import Console

from notify.cli.options import BrokerAddress, Security, broker_option, security_options
from notify.cli.request import request
from notify.cli.tables import new_table, print_table
from notify.config import TOPIC_KEYS, validate_topic
from notify.errors import InvalidTopicError, NotifyError, TransactionError
from notify.protocol.frames import encode_line
from notify.protocol.keys import validate_key

EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
HTTP_TIMEOUT_S: Final = 60.0
ADMIN_SESSION: Final = "admin-cli"

F = TypeVar("F", bound=Callable[..., Any])


class AdminError(Exception):
    """A failure to report as one line, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"notify: {message}", err=True)
    sys.exit(code)


# ---------------------------------------------------------------------- HTTP admin client


class AdminClient:
    """Blocking JSON calls to a broker's ``/api`` (urllib: nothing to close)."""

    def __init__(
        self,
        base_url: str,
        security: Security | None = None,
        timeout: float = HTTP_TIMEOUT_S,
    ):
        if "://" not in base_url:
            base_url = "http://" + base_url
        self.base = base_url.rstrip("/")
        sec = security or Security()
        self.secret = sec.secret
        self.timeout = timeout
        try:
            self._ssl = sec.ssl_context() if self.base.startswith("https:") else None
        except NotifyError as e:
            raise AdminError(str(e), EXIT_USAGE) from None

    def call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None or method != "GET":  # the broker refuses other types
            headers["Content-Type"] = "application/json"
        if self.secret:
            headers["Authorization"] = f"Bearer {self.secret}"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            with e:
                raw = e.read()
            try:
                detail = json.loads(raw).get("error") or raw.decode("utf-8", "replace")
            except (ValueError, AttributeError):
                detail = raw.decode("utf-8", "replace").strip() or e.reason
            raise AdminError(f"broker answered {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise AdminError(f"cannot reach the broker's HTTP API at {self.base}: {reason}") from e
        try:
            return json.loads(raw)
        except ValueError:
            raise AdminError(f"{self.base}{path}: the reply is not JSON") from None


def _client(broker: BrokerAddress, security: Security) -> AdminClient:
    """The HTTP admin client of the broker named by ``-s`` (raises ``NotifyError``)."""
    return AdminClient(broker.http_base(security), security)


def _http_options(f: F) -> F:
    f = click.option(
        "--json", "as_json", is_flag=True, help="machine-readable output (JSON on stdout)"
    )(f)
    f = security_options(f)
    return broker_option(f)


def _run(action: Callable[[], None]) -> None:
    try:
        action()
    except AdminError as e:
        _fail(str(e), e.code)
    except NotifyError as e:
        _fail(str(e))


def _emit_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def _console() -> Any:
    return Console()


def _table(title: str, columns: list[tuple[str, str]], keep_whole: int | None = None) -> Any:
    """A rich table; column ``keep_whole`` (an index) holds ids to copy: folded, never cut
    (print it with :func:`notify.cli.tables.print_table`)."""
    return new_table(title, columns, keep_whole)


def fmt_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    v = float(n)
    while abs(v) >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    return f"{int(v)} B" if i == 0 else f"{v:.1f} {units[i]}"


def _check_topic(name: str) -> str:
    try:
        return validate_topic(name)
    except InvalidTopicError as e:
        raise click.BadParameter(str(e), param_hint="TOPIC") from None


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


# ---------------------------------------------------------------------- topics


@click.group()
def topics() -> None:
    """List, describe and create topics (through the broker's HTTP API)."""


@topics.command("list")
@_http_options
def topics_list(broker: BrokerAddress, security: Security, as_json: bool) -> None:
    """Topics with partitions, sizes and offsets."""

    def action() -> None:
        data = _client(broker, security).call("GET", "/api/topics")["topics"]
        if as_json:
            return _emit_json(data)
        table = _table(
            "topics",
            [
                ("topic", "left"),
                ("partitions", "right"),
                ("size", "right"),
                ("messages in", "right"),
                ("fetches", "right"),
                ("groups", "left"),
                ("flags", "left"),
            ],
        )
        for t in data:
            flags = []
            if not t["accept_publish"]:
                flags.append("no-publish")
            if not t["accept_subscribe"]:
                flags.append("no-subscribe")
            if t["config"].get("unflush_threshold") == 0:
                flags.append("group-commit")
            table.add_row(
                t["name"],
                str(t["num_partitions"]),
                fmt_bytes(t["size_bytes"]),
                str(t["put_messages"]),
                str(t["get_requests"]),
                ", ".join(t["groups"]) or "-",
                " ".join(flags) or "-",
            )
        _console().print(table)

    _run(action)


@topics.command("describe")
@click.argument("topic")
@_http_options
def topics_describe(topic: str, broker: BrokerAddress, security: Security, as_json: bool) -> None:
    """One topic: its partitions' offsets and the consumer groups' lag."""
    _check_topic(topic)

    def action() -> None:
        client = _client(broker, security)
        t = client.call("GET", f"/api/topics/{_quote(topic)}")
        groups = [g for g in client.call("GET", "/api/groups")["groups"] if g["topic"] == topic]
        if as_json:
            return _emit_json({**t, "consumers": groups})
        console = _console()
        console.print(
            f"[bold]{t['name']}[/bold]: {t['num_partitions']} partitions, "
            f"{fmt_bytes(t['size_bytes'])}, {t['put_messages']} messages in, "
            f"publish={'yes' if t['accept_publish'] else 'no'} "
            f"subscribe={'yes' if t['accept_subscribe'] else 'no'}"
        )
        parts = _table(
            "partitions",
            [
                ("partition", "right"),
                ("min offset", "right"),
                ("max offset", "right"),
                ("flushed", "right"),
                ("size", "right"),
                ("segments", "right"),
                ("state", "left"),
            ],
        )
        for p in t["partitions"]:
            parts.add_row(
                str(p["partition"]),
                str(p["min_offset"]),
                str(p["max_offset"]),
                str(p["flushed_offset"]),
                fmt_bytes(p["size_bytes"]),
                str(p["segments"]),
                "read-only: " + p["failed"] if p["failed"] else "ok",
            )
        console.print(parts)
        if groups:
            lag = _table(
                "consumer groups",
                [
                    ("group", "left"),
                    ("partition", "right"),
                    ("offset", "right"),
                    ("lag (messages)", "right"),
                    ("lag (bytes)", "right"),
                    ("last fetch", "right"),
                ],
            )
            for g in groups:
                n = g.get("lag_messages")
                lag.add_row(
                    g["group"],
                    str(g["partition"]),
                    str(g["offset"]),
                    "?" if n is None else (str(n) if g.get("lag_messages_exact") else f"~{n}"),
                    fmt_bytes(g["lag_bytes"]),
                    f"{g['idle_seconds']:.0f}s ago" + ("" if g.get("live", True) else " (gone)"),
                )
            console.print(lag)
        config = _table("config", [("key", "left"), ("value", "left")])
        for k, v in t["config"].items():
            config.add_row(k, str(v))
        console.print(config)

    _run(action)


def _parse_settings(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        if key not in TOPIC_KEYS:
            raise click.BadParameter(
                f"unknown topic key {key!r} (known: {', '.join(TOPIC_KEYS)})", param_hint="--set"
            )
        out[key] = value
    return out


@topics.command("create")
@click.argument("topic")
@click.option(
    "-p", "--partitions", type=click.IntRange(1, 65536), default=None, help="numPartitions"
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="another [topic=NAME] key, e.g. --set unflushThreshold=0 (repeatable)",
)
@_http_options
def topics_create(
    topic: str,
    partitions: int | None,
    settings: tuple[str, ...],
    broker: BrokerAddress,
    security: Security,
    as_json: bool,
) -> None:
    """Create a topic: the broker appends [topic=NAME] to its server.ini and reloads."""
    _check_topic(topic)
    config = _parse_settings(settings)
    body: dict[str, Any] = {"name": topic, "config": config}
    if partitions is not None:
        body["numPartitions"] = partitions

    def action() -> None:
        reply = _client(broker, security).call("POST", "/api/topics", body)
        if as_json:
            return _emit_json(reply)
        t = reply["topic"]
        click.echo(f"created topic {t['name']} with {t['num_partitions']} partition(s)")

    _run(action)


# ---------------------------------------------------------------------- transactions


@click.group()
def tx() -> None:
    """List transactions; resolve in-doubt (prepared) ones by hand."""


@tx.command("list")
@click.option("--in-doubt", is_flag=True, help="only prepared transactions awaiting a decision")
@_http_options
def tx_list(in_doubt: bool, broker: BrokerAddress, security: Security, as_json: bool) -> None:
    """Transactions in flight and in doubt."""

    def action() -> None:
        path = "/api/transactions" + ("?in_doubt=1" if in_doubt else "")
        txs = _client(broker, security).call("GET", path)["transactions"]
        if as_json:
            return _emit_json(txs)
        if not txs:
            click.echo("no transactions" + (" in doubt" if in_doubt else " in flight"))
            return
        table = _table(
            "transactions",
            [
                ("key", "left"),
                ("type", "left"),
                ("state", "left"),
                ("messages", "right"),
                ("bytes", "right"),
                ("age", "right"),
                ("producer group", "left"),
            ],
            keep_whole=0,
        )
        for t in txs:
            table.add_row(
                t["key"],
                "XA" if t["xa"] else "local",
                t["state"],
                str(t["messages"]),
                fmt_bytes(t["bytes"]),
                f"{t['age_seconds']:.0f}s",
                t["producer_group"] or "-",
            )
        print_table(table, [t["key"] for t in txs], "keys", _console())
        doubt = sum(1 for t in txs if t["in_doubt"])
        if doubt:
            click.echo(f"{doubt} in doubt (PREPARED): resolve with notify tx commit|rollback KEY")

    _run(action)


def _resolve(
    key: str, commit: bool, broker: BrokerAddress, security: Security, as_json: bool
) -> None:
    try:
        validate_key(key)
    except TransactionError as e:
        raise click.BadParameter(str(e), param_hint="KEY") from None
    verb = "commit" if commit else "rollback"

    def action() -> None:
        if not broker.is_url:  # the wire transaction command: no HTTP port needed
            ttype = "COMMIT_TWO_PHASE" if commit else "ROLLBACK"
            try:
                reply = request(
                    broker.server,
                    lambda o: encode_line("transaction", key, ADMIN_SESSION, ttype, o),
                    security.transport(),
                )
            except NotifyError as e:
                raise AdminError(f"{verb} {key}: {e}") from None
            result = {
                "key": key,
                "outcome": "committed" if commit else "rolled_back",
                "detail": reply.body.decode("utf-8", "replace"),
            }
        else:
            result = AdminClient(broker.server, security).call(
                "POST", f"/api/transactions/{_quote(key)}/{verb}"
            )
        if as_json:
            return _emit_json(result)
        click.echo(f"{key}: {result['outcome'].replace('_', ' ')}")

    _run(action)


@tx.command("commit")
@click.argument("key")
@_http_options
def tx_commit(
    key: str, broker: BrokerAddress, security: Security, as_json: bool
) -> None:
    """Commit an in-doubt (PREPARED) transaction: its messages become visible."""
    _resolve(key, True, broker, security, as_json)


@tx.command("rollback")
@click.argument("key")
@_http_options
def tx_rollback(
    key: str, broker: BrokerAddress, security: Security, as_json: bool
) -> None:
    """Roll back an in-doubt (PREPARED) transaction: its messages are dropped."""
    _resolve(key, False, broker, security, as_json)


# ---------------------------------------------------------------------- retention


@click.group()
def retention() -> None:
    """Retention (deletePolicy) on demand."""


@retention.command("run")
@click.argument("topic")
@_http_options
def retention_run(topic: str, broker: BrokerAddress, security: Security, as_json: bool) -> None:
    """Apply TOPIC's deletePolicy now instead of waiting for its deleteWhen schedule."""
    _check_topic(topic)

    def action() -> None:
        path = f"/api/topics/{_quote(topic)}/retention"
        reply = _client(broker, security).call("POST", path)
        if as_json:
            return _emit_json(reply)
        results = reply["results"]
        removed = sum(len(r["removed"]) for r in results)
        if not results:
            click.echo(f"{topic}: nothing expired")
        for r in results:
            verb = "archived" if r["action"] == "archive" else "deleted"
            names = ", ".join(r["removed"]) or "nothing"
            line = f"{topic}-{r['partition']}: {verb} {names}"
            if r["kept_for_consumers"]:
                line += f" ({r['kept_for_consumers']} expired segment(s) kept for live consumers)"
            click.echo(line)
        if results:
            click.echo(f"{removed} segment(s) removed")

    _run(action)


def register(main: click.Group) -> None:
    """Add the admin command groups to the ``notify`` CLI."""
    for group in (topics, tx, retention):
        main.add_command(group)
