"""The one runner of the README's and the documentation's code blocks.

* A Markdown file's fenced blocks are read with their line and the reason they are not run
  (``<!-- not-runnable: why -->`` right before a block; the site does not show it).
* Every ```` ```python ```` and ```` ```bash ```` block of a file runs, in the file's order
  (a page is a walkthrough: its blocks share a working directory and one broker), after
  pointing the pages' well-known addresses at this test's servers: the broker
  ``127.0.0.1:8123`` (HTTP ``127.0.0.1:8120``; a real broker process with the sample topics),
  PostgreSQL and MariaDB ``app@127.0.0.1/app`` (started by the pages' own
  ``scripts/dev-db.sh`` on free ports) and ZooKeeper ``127.0.0.1:2181/meta``. A block that
  fails, hangs or names an address this test does not serve fails.
* After a block, the checks of :mod:`tests.docs.checks` whose marker it contains look at
  what it did (the row is there, the message is visible, the output says what the comment
  says).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from notify.testing import BrokerProcess
from tests.conftest import IN_CI
from tests.docs.harness import example_broker
from tests.services import MariaDBServer, PostgresServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
BLOCK_TIMEOUT_S = 120
RUNNABLE = ("python", "bash")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
NOT_RUNNABLE = re.compile(r"<!--\s*not-runnable:(.*?)-->")


@dataclass(frozen=True)
class DocBlock:
    """One fenced block of a file: where it is (path relative to the checkout), its
    language and text, and why it is not run (None: it runs)."""

    page: str
    line: int
    lang: str
    code: str
    not_runnable: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.not_runnable is None


def page_blocks(path: Path) -> list[DocBlock]:
    """The fenced blocks of a Markdown file (indented ones inside admonitions too)."""
    page = path.relative_to(ROOT).as_posix()
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

    @property
    def pg_conninfo(self) -> str:
        return f"postgresql://app@127.0.0.1:{self.env['NOTIFY_PG_PORT']}/app"


@pytest.fixture(scope="module")
def dev_db() -> Iterator[DevDatabases]:
    """The example databases of one test module (stopped at its end)."""
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
    work: Path
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

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_")}
        env.update(self.db.env)
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        env["NOTIFY_SERVER"] = self.broker.addr
        env["NOTIFY_CLIENT_DIR"] = str(self.work / "client-state")
        return env


def run_block(block: DocBlock, code: str, work: Path, env: dict[str, str]) -> str:
    """Run one block (a fresh interpreter, or bash with -euo pipefail); its stdout."""
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


def page_env(
    blocks: list[DocBlock], tmp_path: Path, dev_db: DevDatabases, request: pytest.FixtureRequest
) -> PageEnv:
    """The servers the runnable ``blocks`` of one page name, started for them."""
    text = "".join(b.code for b in blocks if b.runs)
    if re.search(r"postgresql(\+psycopg)?://app@|dev-db\.sh postgres", text):
        dev_db.need("postgres")
    if re.search(r"mysql\+pymysql://app@|dev-db\.sh mariadb", text):
        dev_db.need("mariadb")
    broker, zk_url = example_broker(
        tmp_path,
        request,
        zookeeper="2181" in text,
        system={"txCheckBackDelay": 500, "dashboardHttpPort": free_port()},
    )
    work = tmp_path / "work"
    work.mkdir()
    return PageEnv(broker, dev_db, work, zk_url)


def run_page(
    blocks: list[DocBlock], tmp_path: Path, dev_db: DevDatabases, request: pytest.FixtureRequest
) -> list[tuple[DocBlock, str]]:
    """Run the runnable ``blocks`` of one page in order, each followed by its checks; each
    block with its output."""
    from tests.docs.checks import check_block

    env = page_env(blocks, tmp_path, dev_db, request)
    environ = env.environ()
    ran: list[tuple[DocBlock, str]] = []
    for block in blocks:
        if not block.runs:
            continue
        out = run_block(block, env.substitute(block.code), env.work, environ)
        check_block(block, out, env, tmp_path / f"check{block.line}")
        ran.append((block, out))
    return ran
