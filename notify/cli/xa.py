"""``notify xa``: look at and resolve in-doubt 2PC transactions of a coordinator.

A thin layer over :mod:`notify.xa.admin`. Participants are given as ``[NAME=]URL``, NAME
being the name the application registers (defaults: ``broker``, ``pg``, ``mysql``, with a
number appended for the second and later of a kind; without ``NAME=``, the names the
application used are read from the participant's prepared branches)::

    notify xa list     --log var/xa -s 127.0.0.1:8123 --pg orders_db=postgresql://...
    notify xa commit   GTRID --log var/xa ... [--by alice]
    notify xa rollback GTRID --log var/xa ... [--force] [--by alice]
    notify xa forget   GTRID --log var/xa                 (acknowledge heuristic reports)
    notify xa recover  --log var/xa ...                   (one recovery pass, as at start)

``commit``/``rollback``/``forget``/``recover`` lock the log: stop the application first.
``list`` also works while the application runs (it then reads the log without locking it,
and a prepared transaction that has not reached its deadline may simply be in flight).

Exit codes: 0 done, 1 failure (unreachable participant, refused resolution), 2 usage.
"""

from __future__ import annotations

import functools
import getpass
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, cast

import click
from rich.console import Console

from notify.cli.options import Security, security_options
from notify.cli.tables import new_table, print_table
from notify.errors import ConfigError, NotifyError
from notify.xa import records as rec
from notify.xa.admin import DecisionView, InDoubt, TableView, forget, list_in_doubt, resolve
from notify.xa.decisionlog import DecisionLog, peek
from notify.xa.errors import LogLockedError, ParticipantError
from notify.xa.ids import Scope, name_of_branch, validate_name
from notify.xa.participant import ParticipantFactory
from notify.xa.pool import ParticipantPool
from notify.xa.recovery import recover_once
from notify.xa.resources import factory_from_url

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2


def _fail(message: str, code: int = EXIT_FAILURE) -> None:
    click.echo(f"notify xa: {message}", err=True)
    sys.exit(code)


def build_pool(
    brokers: tuple[str, ...],
    pgs: tuple[str, ...],
    mysqls: tuple[str, ...],
    security: Security | None = None,
    scope: Scope | None = None,
) -> ParticipantPool:
    """A pool with one participant per ``[NAME=]URL`` option (brokers with ``security``).

    A participant given without ``NAME=`` is registered under the names the application
    gave it, read from its prepared branches of ``scope`` (a branch qualifier is the
    participant's registered name), so decisions recorded here match the application's
    names; with nothing prepared (or no ``scope``) it falls back to ``broker``/``pg``/
    ``mysql`` (numbered from the second of a kind)."""
    sec = security or Security()
    tls = sec.ssl_context()
    pool = ParticipantPool(max_idle=1)
    for kind, values in (("broker", brokers), ("pg", pgs), ("mysql", mysqls)):
        for i, value in enumerate(values):
            name, sep, url = value.partition("=")
            named = bool(sep) and "://" not in name and ":" not in name
            if not named:
                name, url = (kind if i == 0 else f"{kind}{i + 1}"), value
            if kind == "pg" and "://" not in url and "=" not in url:
                raise ConfigError(f"--pg expects a postgresql:// URL, got {url!r}")
            if kind == "mysql" and "://" not in url:
                raise ConfigError(f"--mysql expects a mysql+pymysql:// URL, got {url!r}")
            if kind == "broker" and "://" not in url:
                url = f"meta://{url}"
            factory = factory_from_url(url, sec.secret, tls)
            names = [validate_name(name)]
            if not named and scope is not None:
                names = _names_in_use(factory, scope) or names
            for n in names:
                pool.register(n, factory)
    return pool


def _names_in_use(factory: ParticipantFactory, scope: Scope) -> list[str]:
    """The participant names (branch qualifiers) of ``scope``'s branches prepared at the
    resource ``factory`` reaches; empty when none (or unreachable: listing reports it)."""
    try:
        p = factory()
    except (ParticipantError, OSError):
        return []
    try:
        xids = p.recover(scope)
    except ParticipantError:
        return []
    finally:
        p.close()
    found = {n: None for n in map(name_of_branch, xids) if n is not None}
    return list(found)


def _unmatched(pool: ParticipantPool, log: DecisionView) -> list[str]:
    """Branch names in the log's decisions that no participant of ``pool`` carries."""
    names = set(pool.names())
    missing = {b.name for d in log.decisions() for b in d.branches if b.name not in names}
    return sorted(missing)


def _require_log(log_dir: str) -> Scope:
    """Fail unless ``log_dir`` holds a decision log (never create one by accident); its
    coordinator's scope."""
    try:
        found = peek(log_dir)
    except NotifyError as e:
        _fail(str(e))
    if found is None:
        _fail(f"{log_dir}: no decision log there", EXIT_USAGE)
    assert found is not None
    return TableView(found).scope


def _warn_unmatched(pool: ParticipantPool, log: DecisionView) -> None:
    for name in _unmatched(pool, log):
        click.echo(
            f"notify xa: the log names participant {name!r}, which is none of those given "
            f"({', '.join(pool.names())}): give it as --broker/--pg/--mysql {name}=URL, or "
            "its decision stays open",
            err=True,
        )


@contextmanager
def _session(ctx: click.Context) -> Iterator[tuple[DecisionLog, ParticipantPool]]:
    opts = ctx.obj
    scope = _require_log(opts["log"])
    pool = build_pool(opts["broker"], opts["pg"], opts["mysql"], opts["security"], scope)
    try:
        log = DecisionLog.open(opts["log"])
    except BaseException:
        pool.close()
        raise
    try:
        yield log, pool
    finally:
        pool.close()
        log.close()


def _broker_options(f: Any) -> Any:
    """``-s/--server [NAME=]host:port`` (repeatable), the broker option of every command;
    the older ``--broker`` still works, hidden. The command gets them as ``broker``."""

    @functools.wraps(f)
    def wrapper(*args: Any, server: tuple[str, ...], broker_alias: tuple[str, ...],
                **kwargs: Any) -> Any:
        return f(*args, broker=server + broker_alias, **kwargs)

    out = click.option("--broker", "broker_alias", multiple=True, hidden=True,
                       help="deprecated: -s/--server")(wrapper)
    return click.option("-s", "--server", multiple=True,
                        help="[NAME=]host:port of a broker (repeatable)")(out)


def _participant_options(f: Any) -> Any:
    for opt in reversed(
        [
            click.option(
                "--log", "log_dir", required=True, type=click.Path(file_okay=False),
                help="the coordinator's decision log directory",
            ),
            _broker_options,
            click.option("--pg", multiple=True, help="[NAME=]postgresql://... URL"),
            click.option("--mysql", multiple=True, help="[NAME=]mysql+pymysql://... URL"),
            security_options,
        ]
    ):  # fmt: skip
        f = cast(Callable[[Any], Any], opt)(f)
    return f


@click.group("xa")
def xa() -> None:
    """In-doubt two-phase-commit transactions of a notify.xa coordinator."""


def _ctx(log_dir: str, broker: tuple[str, ...], pg: tuple[str, ...], mysql: tuple[str, ...],
         security: Security) -> click.Context:  # fmt: skip
    ctx = click.get_current_context()
    ctx.obj = {"log": log_dir, "broker": broker, "pg": pg, "mysql": mysql, "security": security}
    return ctx


def _describe(item: InDoubt) -> dict[str, Any]:
    deadline = item.deadline_s
    return {
        "gtrid": item.gtrid.decode(),
        "status": item.status,
        "deadline": deadline,
        "expired": deadline is not None and deadline < time.time(),
        "prepared": [f"{n}:{x.bqual.decode(errors='replace')}" for n, x in item.prepared],
        "decided_branches": [b.name for b in item.decision.branches] if item.decision else [],
        "heuristics": [
            {"branch": h.name, "kind": h.kind.name.lower(), "message": h.message}
            for h in item.heuristics
        ],
    }


@xa.command("list")
@_participant_options
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def xa_list(
    log_dir: str,
    broker: tuple[str, ...],
    pg: tuple[str, ...],
    mysql: tuple[str, ...],
    security: Security,
    as_json: bool,
) -> None:
    """List in-doubt transactions: prepared branches, live decisions, heuristic reports."""
    scope = _require_log(log_dir)
    try:
        pool = build_pool(broker, pg, mysql, security, scope)
    except (ConfigError, NotifyError) as e:
        _fail(str(e), EXIT_USAGE)
    try:
        try:
            with DecisionLog.open(log_dir) as log:
                items, errors = list_in_doubt(pool, log)
                _warn_unmatched(pool, log)
                live = False
        except LogLockedError:
            table = peek(log_dir)
            if table is None:
                _fail(f"{log_dir}: no decision log there")
            assert table is not None
            items, errors = list_in_doubt(pool, TableView(table))
            _warn_unmatched(pool, TableView(table))
            live = True
    except NotifyError as e:
        _fail(str(e))
    finally:
        pool.close()
    rows = [_describe(i) for i in items]
    if as_json:
        click.echo(json.dumps({"in_use": live, "errors": errors, "transactions": rows}, indent=2))
    else:
        table_out = new_table(
            f"in-doubt transactions in {log_dir}",
            [("gtrid", "left"), ("status", "left"), ("prepared branches", "left"),
             ("deadline", "left")],
            0,
        )  # fmt: skip
        for r in rows:
            when = time.strftime("%H:%M:%S", time.localtime(r["deadline"])) if r["deadline"] else ""
            heur = "".join(
                f"\n  heuristic {h['kind']} at {h['branch']}: {h['message']}"
                for h in r["heuristics"]
            )
            table_out.add_row(
                r["gtrid"], r["status"] + heur, ", ".join(r["prepared"]) or "-",
                when + (" (expired)" if r["expired"] else ""),
            )  # fmt: skip
        console = Console()
        print_table(table_out, [r["gtrid"] for r in rows], "gtrids", console)
        if live:
            console.print("the log is in use: transactions before their deadline may be in flight")
        for name, err in errors.items():
            console.print(f"[red]{name}: {err}[/red]")
    if errors:
        sys.exit(EXIT_FAILURE)


def _resolve(gtrid: str, commit: bool, force: bool, by: str | None) -> None:
    ctx = click.get_current_context()
    who = by or f"{getpass.getuser()}@notify-xa"
    try:
        with _session(ctx) as (log, pool):
            result = resolve(pool, log, gtrid, commit, who, force)
            _warn_unmatched(pool, log)
    except ConfigError as e:
        _fail(str(e), EXIT_USAGE)
    except NotifyError as e:
        _fail(str(e))
    verb = "committed" if result.outcome is rec.Outcome.COMMIT else "rolled back"
    for name, xid in result.done:
        click.echo(f"{verb} {name}:{xid.bqual.decode(errors='replace')}")
    for h in result.heuristics:
        click.echo(f"heuristic recorded: {h.message}")
    for name, _xid, err in result.failed:
        click.echo(f"FAILED {name}: {err}", err=True)
    if not result.complete:
        _fail(f"{gtrid}: decision recorded; recovery will finish the failed branches")
    click.echo(f"{gtrid}: {verb}")


@xa.command("commit")
@click.argument("gtrid")
@_participant_options
@click.option("--force", is_flag=True, help="override a logged rollback decision")
@click.option("--by", default=None, help="who decides (recorded in the log)")
def xa_commit(
    gtrid: str,
    log_dir: str,
    broker: tuple[str, ...],
    pg: tuple[str, ...],
    mysql: tuple[str, ...],
    security: Security,
    force: bool,
    by: str | None,
) -> None:
    """Commit an in-doubt transaction by hand (recorded as an admin decision)."""
    _ctx(log_dir, broker, pg, mysql, security)
    _resolve(gtrid, True, force, by)


@xa.command("rollback")
@click.argument("gtrid")
@_participant_options
@click.option("--force", is_flag=True, help="override a logged commit decision (heuristic)")
@click.option("--by", default=None, help="who decides (recorded in the log)")
def xa_rollback(
    gtrid: str,
    log_dir: str,
    broker: tuple[str, ...],
    pg: tuple[str, ...],
    mysql: tuple[str, ...],
    security: Security,
    force: bool,
    by: str | None,
) -> None:
    """Roll back an in-doubt transaction by hand (recorded as an admin decision)."""
    _ctx(log_dir, broker, pg, mysql, security)
    _resolve(gtrid, False, force, by)


@xa.command("forget")
@click.argument("gtrid")
@click.option("--log", "log_dir", required=True, type=click.Path(file_okay=False))
@click.option("--by", default=None, help="who acknowledges (recorded in the log)")
def xa_forget(gtrid: str, log_dir: str, by: str | None) -> None:
    """Acknowledge the heuristic reports of a transaction (they stop being listed)."""
    _require_log(log_dir)
    try:
        with DecisionLog.open(log_dir) as log:
            n = forget(log, gtrid, by or f"{getpass.getuser()}@notify-xa")
    except NotifyError as e:
        _fail(str(e))
    click.echo(f"{gtrid}: {n} heuristic report(s) acknowledged")


@xa.command("recover")
@_participant_options
def xa_recover(
    log_dir: str,
    broker: tuple[str, ...],
    pg: tuple[str, ...],
    mysql: tuple[str, ...],
    security: Security,
) -> None:
    """Run one recovery pass, as the coordinator does when it starts."""
    ctx = _ctx(log_dir, broker, pg, mysql, security)
    try:
        with _session(ctx) as (log, pool):
            report = recover_once(pool, log, lambda g: False, pool.names(), 0.0)
            _warn_unmatched(pool, log)
    except ConfigError as e:
        _fail(str(e), EXIT_USAGE)
    except NotifyError as e:
        _fail(str(e))
    click.echo(
        f"committed {len(report.committed)}, rolled back {len(report.rolled_back)}, "
        f"finished {len(report.completed)} decisions, failed {len(report.failed)}"
    )
    for name, err in report.errors.items():
        click.echo(f"{name}: {err}", err=True)
    if not report.clean:
        sys.exit(EXIT_FAILURE)
