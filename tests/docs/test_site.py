"""The documentation site: it builds strictly, its generated references cover the code, a
real browser renders it, and its benchmark figures are whole data.

The site is built once per run (``mkdocs build --strict`` into a temporary directory): a
broken link, a missing anchor, a docstring griffe cannot read or an unknown page fails it.
Headless Chromium then opens pages of it over HTTP.
"""

from __future__ import annotations

import csv
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from notify.cli import main as cli_main
from notify.config import settings
from tests.conftest import IN_CI
from tests.http.test_dashboard import BROWSER, chromium

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MERMAID_JS = DOCS / "assets" / "javascripts" / "mermaid.min.js"
PAGES = sorted(p for p in DOCS.rglob("*.md"))


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
    def walk(cmd: click.Command, ctx: click.Context) -> Iterator[click.Context]:
        yield ctx
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                if sub.hidden:  # deprecated spellings, left out of the reference
                    continue
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx))

    seen = 0
    for ctx in walk(cli_main, click.Context(cli_main, info_name="notify")):
        assert f"<code>{ctx.command_path}</code>" in html, ctx.command_path
        for p in ctx.command.params:
            if isinstance(p, click.Option) and not p.hidden:
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
