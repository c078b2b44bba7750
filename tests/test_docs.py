"""The documentation site: it builds strictly, its generated references cover the code, every
code block of ``docs/`` runs as written, and a real browser renders it.

* The site is built once per run (``mkdocs build --strict`` into a temporary directory): a
  broken link, a missing anchor, a docstring griffe cannot read or an unknown page fails it.
* Every ```` ```python ```` and ```` ```bash ```` block of every page runs, page by page in
  the page's order (a page is a walkthrough: its blocks share a working directory and one
  broker), after pointing the pages' well-known addresses at this test's servers: the broker
  ``127.0.0.1:8123`` (HTTP ``127.0.0.1:8120``; a real broker process with the sample topics),
  PostgreSQL and MariaDB ``app@127.0.0.1/app`` (started by the pages' own
  ``scripts/dev-db.sh`` on free ports) and ZooKeeper ``127.0.0.1:2181/meta``. A block that
  cannot run here says so and why, in an HTML comment the site does not show, right before
  it: ``<!-- not-runnable: needs a Spark cluster -->``; a block with neither fails.
* Every ```` ```ini ```` block is a ``server.ini`` the broker's own parser accepts.
* Headless Chromium opens the built home page and a guide over HTTP.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from notify.cli import main as cli_main
from notify.config import parse_config, settings
from notify.testing import BrokerProcess
from tests.conftest import IN_CI
from tests.http.test_dashboard import BROWSER, chromium
from tests.services import MariaDBServer, PostgresServer, ZooKeeperServer
from tests.services_conftest import running

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MERMAID_JS = DOCS / "assets" / "javascripts" / "mermaid.min.js"
VENV_BIN = Path(sys.executable).parent
TOPICS = {"demo": 4, "orders": 2, "audit": 1, "jobs": 2}  # conf/server.ini's sample topics
BLOCK_TIMEOUT_S = 120
RUNNABLE = ("python", "bash")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
NOT_RUNNABLE = re.compile(r"<!--\s*not-runnable:(.*?)-->")


@dataclass(frozen=True)
class DocBlock:
    """One fenced block of a page: where it is, its language and text, and why it is not
    run (None: it runs)."""

    page: str
    line: int
    lang: str
    code: str
    not_runnable: str | None

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def page_blocks(path: Path) -> list[DocBlock]:
    """The fenced blocks of a Markdown page (indented ones inside admonitions too)."""
    page = path.relative_to(DOCS).as_posix()
    lines = path.read_text().splitlines()
    out: list[DocBlock] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None or not m.group(2):
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
        before = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
        mark = NOT_RUNNABLE.search(before)
        reason = mark.group(1).strip() if mark else None
        out.append(DocBlock(page, i + 1, lang, "\n".join(body) + "\n", reason))
        i = j + 1
    return out


PAGES = sorted(p for p in DOCS.rglob("*.md"))
BLOCKS = {p.relative_to(DOCS).as_posix(): page_blocks(p) for p in PAGES}
RUN_PAGES = sorted(
    page
    for page, blocks in BLOCKS.items()
    if any(b.lang in RUNNABLE and b.not_runnable is None for b in blocks)
)


def test_every_block_runs_or_says_why_not() -> None:
    """A Python or shell block is run below, or it carries a reason; a marker with no reason
    or on a block that is not Python or shell (where it would mean nothing) is an error."""
    assert len(RUN_PAGES) >= 8
    for blocks in BLOCKS.values():
        for b in blocks:
            if b.not_runnable is not None:
                assert b.not_runnable, f"{b.where}: not-runnable without a reason"
                assert b.lang in RUNNABLE, f"{b.where}: not-runnable marks a {b.lang} block"
    every = [b for blocks in BLOCKS.values() for b in blocks if b.lang in RUNNABLE]
    ran = [b for b in every if b.not_runnable is None]
    assert len(ran) >= len(every) // 2, "most examples must run"


@pytest.mark.parametrize(
    "block",
    [b for blocks in BLOCKS.values() for b in blocks if b.lang == "ini"],
    ids=lambda b: b.where,
)
def test_ini_blocks_are_valid_config(block: DocBlock) -> None:
    parse_config(block.code)


# --------------------------------------------------------------------------- running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DevDatabases:
    """The databases ``scripts/dev-db.sh`` starts, as a reader would, on free ports."""

    base: Path
    env: dict[str, str] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def need(self, kind: str) -> None:
        if kind in self.started:
            return
        available = PostgresServer.available() if kind == "postgres" else MariaDBServer.available()
        if not available:
            msg = f"{kind} not installed (bash scripts/services.sh install)"
            if IN_CI:
                pytest.fail(msg)
            pytest.skip(msg)
        self.script(kind, "start")
        self.started.append(kind)

    def script(self, kind: str, action: str) -> None:
        proc = subprocess.run(
            ["bash", str(ROOT / "scripts" / "dev-db.sh"), kind, action],
            env={**os.environ, **self.env}, capture_output=True, text=True, timeout=120,
            check=False,
        )
        assert proc.returncode == 0, f"dev-db.sh {kind} {action}:\n{proc.stdout}{proc.stderr}"

    def stop(self) -> None:
        for kind in self.started:
            self.script(kind, "stop")


@pytest.fixture(scope="module")
def dev_db() -> Iterator[DevDatabases]:
    # not under pytest's 0700 temporary root: the servers run as their own users
    base = Path(tempfile.mkdtemp(prefix="notify-docs-db-"))
    base.chmod(0o755)
    dbs = DevDatabases(base)
    dbs.env = {
        "NOTIFY_DB_DIR": str(base),
        "NOTIFY_PG_PORT": str(free_port()),
        "NOTIFY_MARIADB_PORT": str(free_port()),
    }
    try:
        yield dbs
    finally:
        dbs.stop()
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class PageEnv:
    """What one page's blocks run against."""

    broker: BrokerProcess
    db: DevDatabases
    zk: str | None = None

    def substitute(self, code: str) -> str:
        host, port = self.broker.addr.rsplit(":", 1)
        out = code.replace('("127.0.0.1", 8123)', f'("{host}", {port})')
        out = out.replace("127.0.0.1:8123", self.broker.addr)
        http = f"127.0.0.1:{self.broker.http_port}"
        out = re.sub(r"\b(?:localhost|127\.0\.0\.1):8120\b", http, out)
        pg, my = self.db.env["NOTIFY_PG_PORT"], self.db.env["NOTIFY_MARIADB_PORT"]
        out = re.sub(r"(postgresql(?:\+psycopg)?://app@127\.0\.0\.1)/app", rf"\1:{pg}/app", out)
        out = re.sub(r"(mysql\+pymysql://app@127\.0\.0\.1)/app", rf"\1:{my}/app", out)
        if self.zk is not None:
            out = out.replace("127.0.0.1:2181/meta", self.zk)
        out = out.replace("bash scripts/", f"bash {ROOT}/scripts/")
        for served in (r"\b8123\b", r"\b8120\b", r"app@127\.0\.0\.1/", r"\b2181\b"):
            assert not re.search(served, out), f"an address this test does not serve: {served}"
        return out

    def environ(self, work: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_")}
        env.update(self.db.env)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env["NOTIFY_SERVER"] = self.broker.addr
        env["NOTIFY_HTTP"] = self.broker.http_url
        env["NOTIFY_CLIENT_DIR"] = str(work / "client-state")
        return env


def run_block(block: DocBlock, code: str, work: Path, env: dict[str, str]) -> str:
    if block.lang == "python":
        path = work / f"block{block.line}.py"
        path.write_text(code)
        cmd = [sys.executable, str(path)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    proc = subprocess.run(
        cmd, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{block.where} exit {proc.returncode}\n{code}\n--- stdout\n{proc.stdout}"
        f"\n--- stderr\n{proc.stderr}"
    )
    return proc.stdout


@pytest.mark.parametrize("page", RUN_PAGES)
def test_page_blocks_run(
    page: str, tmp_path: Path, dev_db: DevDatabases, request: pytest.FixtureRequest
) -> None:
    blocks = [b for b in BLOCKS[page] if b.lang in RUNNABLE and b.not_runnable is None]
    text = "".join(b.code for b in blocks)
    if re.search(r"postgresql(\+psycopg)?://app@|dev-db\.sh postgres", text):
        dev_db.need("postgres")
    if re.search(r"mysql\+pymysql://app@|dev-db\.sh mariadb", text):
        dev_db.need("mariadb")
    zk_url = zk_conf = None
    if "2181" in text:
        zk: ZooKeeperServer = running(request.getfixturevalue("zookeeper"))
        root: str = request.getfixturevalue("zk_root")
        zk_url = f"{zk.connect}{root}"
        zk_conf = {"zkEnable": True, "zkConnect": zk.connect, "zkRoot": root}
    broker = BrokerProcess(
        tmp_path / "broker",
        topics=TOPICS,
        system={"txCheckBackDelay": 500, "dashboardHttpPort": free_port()},
        zookeeper=zk_conf,
    )
    request.addfinalizer(broker.stop)
    broker.start()
    env = PageEnv(broker, dev_db, zk_url)
    work = tmp_path / "work"
    work.mkdir()
    environ = env.environ(work)
    for block in blocks:
        run_block(block, env.substitute(block.code), work, environ)


# --------------------------------------------------------------------------- the site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once (strict: any warning fails the build)."""
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        msg = "mkdocs not installed (pip install -e '.[docs]', or bash scripts/setup.sh)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr}"
    return out


def test_site_builds_strictly_with_every_page(site: Path) -> None:
    for page in PAGES:
        rel = page.relative_to(DOCS)
        if rel.parts[0] == "snippets":
            continue
        built = site / rel.with_suffix("") / "index.html"
        if rel.name == "index.md":
            built = site / rel.parent / "index.html"
        assert built.is_file(), f"{rel} was not built"


def test_configuration_reference_lists_every_setting(site: Path) -> None:
    """Generated from notify.config: every key of every section, with its meaning."""
    html = (site / "reference" / "configuration" / "index.html").read_text()
    for s in settings():
        assert f'id="{s.section}.{s.key}"' in html, s.key
        assert s.doc, f"{s.section}.{s.key} has no description"


def test_cli_reference_lists_every_command_and_option(site: Path) -> None:
    html = (site / "reference" / "cli" / "index.html").read_text()
    import click

    def walk(cmd: click.Command, ctx: click.Context) -> Iterator[click.Context]:
        yield ctx
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx))

    seen = 0
    for ctx in walk(cli_main, click.Context(cli_main, info_name="notify")):
        assert f"<code>{ctx.command_path}</code>" in html, ctx.command_path
        for p in ctx.command.params:
            if isinstance(p, click.Option):
                assert p.opts[-1] in html, f"{ctx.command_path} {p.opts[-1]}"
        seen += 1
    assert seen > 30


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(site: Path) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("path", "title", "code"),
    [
        ("/", "notify", "language-bash"),
        ("/guides/queues/", "Queues and dead letters", "language-python"),
    ],
)
def test_browser_renders_the_site(
    site_url: str, tmp_path: Path, path: str, title: str, code: str
) -> None:
    """Chromium loads the page with its scripts: the title, the navigation with every
    section, and a highlighted code block are in the rendered DOM."""
    if BROWSER is None:
        msg = "chromium not installed (bash scripts/browser.sh install)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    run = chromium(BROWSER, tmp_path, site_url + path, "--dump-dom")
    dom = run.stdout.decode()
    assert run.returncode == 0 and "</html>" in dom, run.stderr.decode()[-2000:]
    assert re.search(rf"<title>{re.escape(title)}\b", dom), dom[:500]
    nav = dom[dom.index('class="md-nav md-nav--primary"') :]
    for section in ("Concepts", "Guides", "Reference", "Benchmarks"):
        assert section in nav, section
    assert f'class="{code} highlight"' in dom, f"no highlighted {code} block"
    assert "js-focus-visible" in dom, "the theme's scripts did not run"
    shutil.rmtree(tmp_path, ignore_errors=True)



def test_browser_draws_every_diagram(site: Path, site_url: str, tmp_path: Path) -> None:
    """Every Mermaid diagram of the site is drawn (the theme swaps each ``<pre class=
    "mermaid">`` for a drawn ``<div class="mermaid">``; one with a syntax error stays a
    ``<pre>``), with Mermaid served by the site itself (``scripts/docs.sh install``)."""
    if BROWSER is None or not MERMAID_JS.is_file():
        msg = "chromium or Mermaid missing (bash scripts/browser.sh install; scripts/docs.sh)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    pages = {
        p: html.count('<pre class="mermaid">')
        for p in site.rglob("index.html")
        if (html := p.read_text()).count('<pre class="mermaid">')
    }
    assert len(pages) >= 4 and sum(pages.values()) >= 7
    for page, built in pages.items():
        rel = page.parent.relative_to(site).as_posix()
        url = f"{site_url}/" + ("" if rel == "." else f"{rel}/")
        run = chromium(BROWSER, tmp_path, url, "--dump-dom")
        drawn = run.stdout.decode().count('<div class="mermaid">')
        assert drawn == built, f"{page.relative_to(site)}: {drawn} of {built} diagrams drawn"


def test_benchmark_data_is_whole() -> None:
    """Every result row names a run of runs.csv, every run has results in its area's file,
    and every plot the page shows exists (bench/docs_plots.py draws them from the data)."""
    import csv

    data = DOCS / "benchmarks" / "data"
    with (data / "runs.csv").open(newline="") as f:
        runs = {r["run"]: r for r in csv.DictReader(f)}
    areas = {r["area"] for r in runs.values()}
    for area in areas:
        with (data / f"{area}.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        assert {r["run"] for r in rows} == {k for k, r in runs.items() if r["area"] == area}
    page = (DOCS / "benchmarks" / "index.md").read_text()
    assert {m for m in re.findall(r"bench-table:\s*([\w-]+)", page)} == areas
    for img in re.findall(r"\]\((img/[^)]+)\)", page):
        assert (DOCS / "benchmarks" / img).is_file(), img
