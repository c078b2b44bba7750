"""Import direction of notify, read from the source with ``ast``.

Every import counts: module level, inside functions, under ``if TYPE_CHECKING``. Checked:

(a) no import cycles among modules (each strongly connected component is reported);
(b) layering: ``notify.protocol`` imports nothing of notify but ``notify.errors``;
    ``notify.txlog`` and ``notify.store`` import nothing of broker/core/client/http;
    ``notify.core`` imports neither ``notify.broker`` nor asyncio, socket, os, threading,
    apscheduler; on the client side, package layers (``notify.protocol`` < ``notify.outbox``
    < ``notify.client`` < CLI), a sans-IO ``notify.client.core``, and the broker side
    using only the client's transport;
(c) no import of another package's private module (``pkg._name``);
(d) no ``import`` inside a function in notify/, except the optional heavy dependencies in
    :data:`LAZY_ALLOWED`;
(e) packages as nodes: the CLI package (``notify.cli``) is the top layer, no cycle between
    packages beyond :data:`KNOWN_PACKAGE_CYCLES`, ``notify.txlog`` uses only ``notify.errors``.

:data:`KNOWN_BROKER_OFFENDERS` lists what still fails in ``notify.broker`` while its rebuild
is under way; the rebuild removes entries, nothing else may be added.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from notify.cli import LAZY_COMMANDS

ROOT: Final = Path(__file__).resolve().parents[1]
PACKAGES: Final = ("notify",)

#: Function-level imports allowed in notify/: (module, imported name) with why.
LAZY_ALLOWED: Final = {
    # the audit extra (pyspark + pyarrow, hundreds of MB, optional): only loaded when an
    # audit actually runs, so `notify` and the broker work without it
    ("notify.audit.cli", "pyspark.sql"),
    ("notify.audit.session", "pyspark"),
    ("notify.audit.session", "pyspark.sql"),
    # modules that import pyspark at their top, loaded by the audit command only when it
    # runs (and notify.audit's module __getattr__ that exposes them on first use)
    ("notify.audit", "importlib"),
    ("notify.audit.cli", "notify.audit.checks"),
    ("notify.audit.cli", "notify.audit.report"),
    ("notify.audit.session", "notify.audit.sources"),
    # the HTTP face (aiohttp: a third of a broker's start-up) is loaded only when
    # dashboardHttpPort is set; reload does not start it later (a restart is needed)
    ("notify.broker.app", "notify.http.application"),
    # uvloop is not installed on every platform (the stdlib loop is the fallback)
    ("notify.cli.common", "uvloop"),
    ("notify.client._loopthread", "uvloop"),
    # the outbox's publisher (it imports notify.outbox: SQLAlchemy and the database
    # drivers) is loaded when a relay asks a session for it, so neither a broker (its
    # replication uses the client's transport) nor a plain client loads them
    ("notify.client._session", "notify.client._publisher"),
    # notify.testing's pytest plugin is loaded by every pytest run where notify is installed
    # (and BrokerProcess users run brokers as child processes): the broker's modules are
    # loaded when a test broker starts, not when notify.testing is imported
    ("notify.testing.inproc", "notify.broker.app"),
    # a ZooKeeper session's offset store: kazoo is loaded only by a configserver on ZooKeeper
    # (the embedded one needs none of it), and the ZooKeeper offset store imports this
    # package at its top (the known cycle with notify.offsets)
    ("notify.configserver._server", "notify.configserver._kazoo"),
    ("notify.configserver._server", "notify.offsets.zookeeper"),
}

#: Known offenders inside notify.broker, removed by the broker rebuild: the
#: cycle broker/{service, connection, transactions, delay} <-> replication/sync_master and
#: the broker's function-level imports. Entries are ("cycle", sorted members) or
#: ("lazy", module, imported name). Delete an entry once it is fixed.
KNOWN_BROKER_OFFENDERS: Final[set[tuple[str, ...]]] = set()
NOT_YET_FIXED: Final[set[tuple[str, ...]]] = set()


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    line: int
    in_function: bool
    name: str  # as written (absolute), for messages and the allow-list


def _modules() -> dict[str, tuple[Path, bool]]:
    out: dict[str, tuple[Path, bool]] = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            out[".".join(parts)] = (p, is_pkg)
    return out


MODULES: Final = _modules()


def _absolute(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _resolve(name: str) -> str | None:
    """The module of ours that importing ``name`` loads (its longest known prefix)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _edges() -> list[Edge]:
    edges: list[Edge] = []
    for module, (path, is_pkg) in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))

        def visit(
            node: ast.AST, in_function: bool, module: str = module, is_pkg: bool = is_pkg
        ) -> None:
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(
                    child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                )
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = _absolute(module, is_pkg, child.level, child.module)
                    # `from pkg import sub` imports the submodule pkg.sub
                    names = [
                        f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                        for a in child.names
                    ]
                for name in dict.fromkeys(names):
                    target = _resolve(name) or ""
                    edges.append(Edge(module, target, child.lineno, in_function, name))
                visit(child, inner)

        visit(tree, False)
    return edges


EDGES: Final = _edges()


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = defaultdict(set)
    for e in EDGES:
        if e.target and e.target != e.source:
            g[e.source].add(e.target)
    return g


def _cycles(graph: dict[str, set[str]], nodes: list[str] | None = None) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one node (iterative Tarjan); the nodes
    are the modules unless given."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[tuple[str, ...]] = []
    counter = 0
    for root in sorted(MODULES if nodes is None else nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(tuple(sorted(comp)))
    return out


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_sees_every_kind_of_import() -> None:
    """The checks below can fail: the reader finds function-level, relative and
    TYPE_CHECKING imports (known ones of the code base)."""
    assert any(e.in_function for e in EDGES)
    assert any(
        e.source == "notify.client._session" and e.target == "notify.client._config"
        for e in EDGES
    )
    fake = {"notify.errors": {"notify.config"}, "notify.config": {"notify.errors"}}
    assert _cycles(fake) == [("notify.config", "notify.errors")]


def test_no_import_cycles() -> None:
    known = {k[1:] for k in KNOWN_BROKER_OFFENDERS | NOT_YET_FIXED if k[0] == "cycle"}
    cycles = _cycles(_graph())
    unexpected = [c for c in cycles if c not in known]
    assert not unexpected, "import cycles:\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "\n    ".join(
            f"{e.source}:{e.line} imports {e.name}" + (" (in a function)" if e.in_function else "")
            for e in EDGES
            if e.source in c and e.target in c and e.source != e.target
        )
        for c in unexpected
    )
    stale = known - set(cycles)
    assert not stale, f"fixed, remove from KNOWN_BROKER_OFFENDERS: {sorted(stale)}"


FORBIDDEN: Final = [
    # (importer package, forbidden target prefixes, exceptions)
    ("notify.protocol", ("notify",), ("notify.errors", "notify.protocol")),
    ("notify.txlog", ("notify.broker", "notify.core", "notify.client", "notify.http"), ()),
    ("notify.store", ("notify.broker", "notify.core", "notify.client", "notify.http"), ()),
    ("notify.core", ("notify.broker",), ()),
    # the outbox sits below the client: it reaches the broker through its Publisher Protocol
    (
        "notify.outbox",
        ("notify.client", "notify.broker", "notify.core", "notify.http", "notify.cli"),
        (),
    ),
]
#: Standard / third-party modules the pure core must not touch.
CORE_FORBIDDEN_EXTERNAL: Final = ("asyncio", "socket", "os", "threading", "apscheduler")


def test_layering() -> None:
    bad: list[str] = []
    for e in EDGES:
        for pkg, targets, allowed in FORBIDDEN:
            if not _within(e.source, pkg) or not e.target:
                continue
            if any(_within(e.target, t) for t in targets) and not any(
                _within(e.target, a) for a in allowed
            ):
                bad.append(f"{e.source}:{e.line} imports {e.name} ({pkg} must not)")
        if _within(e.source, "notify.core") and any(
            e.name == m or e.name.startswith(m + ".") for m in CORE_FORBIDDEN_EXTERNAL
        ):
            bad.append(f"{e.source}:{e.line} imports {e.name} (the core is pure)")
    assert not bad, "\n".join(bad)


#: The client side's package layers (README "Layout"): ``notify.protocol`` < ``notify.outbox``
#: < ``notify.client`` < the CLI. Each entry: (package, the packages of notify it may import
#: besides itself).
CLIENT_LAYERS: Final = [
    # the outbox also validates topic names as the broker does (notify.config) and has crash
    # points for the crash tests (notify.faults): leaf modules that import no layer above them
    (
        "notify.outbox",
        (
            "notify.protocol",
            "notify.errors",
            "notify.transitions",
            "notify.config",
            "notify.faults",
        ),
    ),
    (
        "notify.client",
        # notify.configserver: cluster membership (brokers, group members) in ZooKeeper
        (
            "notify.protocol",
            "notify.errors",
            "notify.transitions",
            "notify.outbox",
            "notify.configserver",
        ),
    ),
]
#: The client's sans-IO core: no sockets, event loop, threads or files, and nothing of the
#: client outside the core but its exception classes.
CLIENT_CORE: Final = "notify.client.core"
CLIENT_CORE_ALLOWED: Final = ("notify.client.core", "notify.client._errors")
CLIENT_CORE_FORBIDDEN_EXTERNAL: Final = (
    "asyncio",
    "socket",
    "ssl",
    "select",
    "selectors",
    "os",
    "threading",
    "concurrent",
)
#: What the broker side may use of the client: its transport (the replication links).
BROKER_SIDE: Final = (
    "notify.core",
    "notify.store",
    "notify.broker",
    "notify.replication",
    "notify.txlog",
)
BROKER_MAY_USE_OF_CLIENT: Final = ("notify.client.transport",)


def _client_layer_violations(edges: list[Edge]) -> list[str]:
    bad: list[str] = []
    for e in edges:
        if _within(e.source, CLIENT_CORE) and any(
            e.name == m or e.name.startswith(m + ".") for m in CLIENT_CORE_FORBIDDEN_EXTERNAL
        ):
            bad.append(f"{e.source}:{e.line} imports {e.name} (the client core is sans-IO)")
        if not e.target.startswith("notify"):
            continue
        for pkg, allowed in CLIENT_LAYERS:
            if _within(e.source, pkg) and not any(
                _within(e.target, a) for a in (pkg, *allowed)
            ):
                bad.append(f"{e.source}:{e.line} imports {e.name} ({pkg} is below it)")
        if (
            _within(e.source, CLIENT_CORE)
            and _within(e.target, "notify.client")
            and not any(_within(e.target, a) for a in CLIENT_CORE_ALLOWED)
        ):
            bad.append(f"{e.source}:{e.line} imports {e.name} (the client core is pure)")
        if (
            any(_within(e.source, b) for b in BROKER_SIDE)
            and _within(e.target, "notify.client")
            and not any(_within(e.target, a) for a in BROKER_MAY_USE_OF_CLIENT)
        ):
            bad.append(f"{e.source}:{e.line} imports {e.name} (the broker is no client)")
    return bad


def test_client_side_package_layers() -> None:
    """SEAMS section 1, client side: the outbox never imports the client, the client imports
    only the protocol, the errors, the transition table and the outbox (never the broker,
    the CLI or the XA coordinator); the client's core is sans-IO; the broker side reaches
    the client only for its transport."""
    bad = _client_layer_violations(EDGES)
    assert not bad, "\n".join(bad)


def test_client_layers_can_fail() -> None:
    """Each rule of the client layers reports a made-up offending edge."""
    fake = [
        Edge("notify.client._x", "notify.broker.service", 1, False, "notify.broker.service"),
        Edge("notify.client._x", "notify.cli", 2, False, "notify.cli"),
        Edge("notify.outbox.rows", "notify.client", 3, True, "notify.client"),
        Edge("notify.client.core.wire", "notify.client._pool", 4, False, "notify.client._pool"),
        Edge("notify.client.core.wire", "", 5, False, "asyncio"),
        Edge("notify.broker.service", "notify.client._producer", 6, False, "x"),
    ]
    bad = _client_layer_violations(fake)
    assert [int(b.split(":")[1].split()[0]) for b in bad] == [1, 2, 3, 4, 5, 6], bad
    ok = [
        Edge("notify.client._x", "notify.protocol.frames", 1, False, "notify.protocol.frames"),
        Edge("notify.replication.link", "notify.client.transport", 2, False, "x"),
        Edge("notify.client.core.wire", "notify.client._errors", 3, False, "x"),
    ]
    assert _client_layer_violations(ok) == []


def _package_of(module: str) -> str:
    _path, is_pkg = MODULES[module]
    return module if is_pkg else module.rpartition(".")[0]


def test_no_private_module_of_another_package() -> None:
    bad: list[str] = []
    for e in EDGES:
        if not e.target:
            continue
        leaf = e.target.rpartition(".")[2]
        if not leaf.startswith("_") or leaf.startswith("__"):
            continue
        owner = e.target.rpartition(".")[0]
        if not _within(_package_of(e.source), owner):
            bad.append(f"{e.source}:{e.line} imports private {e.target}")
    assert not bad, "\n".join(bad)


def test_no_function_level_imports() -> None:
    known = {k[1:] for k in KNOWN_BROKER_OFFENDERS | NOT_YET_FIXED if k[0] == "lazy"}
    found = {
        (e.source, e.name): e
        for e in EDGES
        if e.in_function and _within(e.source, "notify")
    }
    unexpected = sorted(k for k in found if k not in LAZY_ALLOWED and k not in known)
    assert not unexpected, "imports inside functions (move them to the top):\n" + "\n".join(
        f"{m}:{found[(m, n)].line} imports {n}" for m, n in unexpected
    )
    stale = sorted(k for k in known | LAZY_ALLOWED if k not in found)
    assert not stale, f"no longer imported lazily, remove from the lists: {stale}"


def test_every_module_imports_on_its_own() -> None:
    """Each module imported first, in a fresh interpreter state: catches cycles through
    package ``__init__`` files that the module graph above does not model."""
    code = (
        "import importlib, sys\n"
        "mods = sys.argv[1:]\n"
        "ours = ('notify',)\n"
        "bad = []\n"
        "for m in mods:\n"
        "    for k in [k for k in sys.modules if k.split('.')[0] in ours]:\n"
        "        del sys.modules[k]\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{m}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    mods = sorted(
        m
        for m in MODULES
        if not m.startswith(("notify.audit", "notify.migrations."))
        and not m.endswith("__main__")
    )  # notify.audit needs the pyspark extra, alembic runs env.py and the revisions itself,
    # __main__ runs the CLI
    r = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, *mods],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]


def test_lazy_commands_never_import_the_cli_and_stay_light() -> None:
    """The CLI loads its subcommands by name (``notify.cli.LAZY_COMMANDS``), an edge the
    graph above cannot see: none of those modules may import ``notify.cli`` (a hidden
    cycle), each entry names a click command, and ``notify broker start`` loads neither
    the database migrations, the XA tooling nor the audit."""
    graph = _graph()
    for name, (module, _attr) in LAZY_COMMANDS.items():
        assert module in MODULES, f"{name}: no module {module}"
        seen, todo = set(), [module]
        while todo:  # everything the command module reaches
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            todo.extend(graph.get(m, ()))
        assert "notify.cli" not in seen, f"{module} reaches notify.cli: a hidden cycle"
    code = (
        "import sys, click\n"
        "from notify.cli import main\n"
        "ctx = click.Context(main)\n"
        "main.get_command(ctx, 'broker')\n"
        "heavy = [m for m in ('alembic', 'notify.migrations', 'notify.cli.xa', 'notify.xa',\n"
        "         'notify.cli.db', 'notify.audit', 'psycopg', 'pymysql', 'aiohttp')\n"
        "         if m in sys.modules]\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    code = (
        "import click\n"
        "from notify.cli import LAZY_COMMANDS, main\n"
        "ctx = click.Context(main)\n"
        "for n in LAZY_COMMANDS:\n"
        "    assert isinstance(main.get_command(ctx, n), click.Command), n\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


#: Cycles between packages that exist today; each names its members. The rebuilds of their
#: owners remove them; a new cycle, or a cycle growing to another package, fails.
KNOWN_PACKAGE_CYCLES: Final = (
    frozenset({"notify.configserver", "notify.client", "notify.offsets"}),
    frozenset({"notify.broker", "notify.http", "notify.replication"}),
)
#: The top of the client side (README "Layout"): only ``python -m notify`` imports it.
CLI: Final = "notify.cli"


def _package(module: str) -> str:
    """The package a module belongs to, at notify's first level (``notify.client._x`` ->
    ``notify.client``); a flat module of notify (``notify.config``) is its own node."""
    parts = module.split(".")
    if parts[0] != "notify" or len(parts) < 2:
        return parts[0]
    first = ".".join(parts[:2])
    return first if MODULES.get(first, (None, False))[1] else module


def _package_violations(edges: list[Edge]) -> list[str]:
    bad: list[str] = []
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        if not e.target:
            continue
        src, dst = _package(e.source), _package(e.target)
        if src != dst:
            graph[src].add(dst)
        if dst == CLI and src not in (CLI, "notify.__main__"):
            bad.append(f"{e.source}:{e.line} imports {e.name} (the CLI is the top layer)")
    nodes = sorted(set(graph) | {n for targets in graph.values() for n in targets})
    for cycle in _cycles(graph, nodes):
        if not any(set(cycle) <= known for known in KNOWN_PACKAGE_CYCLES):
            bad.append("package cycle: " + " <-> ".join(cycle))
    return bad


def test_package_layers() -> None:
    """Packages as nodes: the CLI package is the top layer (nothing of notify imports it but
    ``__main__``), and there is no cycle between packages beyond the known ones; notify.txlog
    uses nothing of notify but its exception classes."""
    bad = _package_violations(EDGES)
    bad += [
        f"{e.source}:{e.line} imports {e.name} (notify.txlog uses only notify.errors)"
        for e in EDGES
        if _within(e.source, "notify.txlog") and not _within(e.target, "notify.txlog")
        and _within(e.target, "notify") and e.target != "notify.errors"
    ]
    assert not bad, "\n".join(bad)


def test_package_layers_can_fail() -> None:
    fake = [
        Edge("notify.broker.service", "notify.cli.common", 1, False, "notify.cli.common"),
        Edge("notify.store.partition", "notify.xa.manager", 2, False, "notify.xa.manager"),
        Edge("notify.xa.manager", "notify.store.partition", 3, False, "notify.store.partition"),
        Edge("notify.cli.dlq", "notify.cli.common", 4, False, "notify.cli.common"),
        Edge("notify.__main__", "notify.cli", 5, False, "notify.cli"),
    ]
    bad = _package_violations(fake)
    assert bad == [
        "notify.broker.service:1 imports notify.cli.common (the CLI is the top layer)",
        "package cycle: notify.store <-> notify.xa",
    ], bad
