"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``).

The configuration and CLI reference pages do not exist as files: they are generated at
every build from the code that defines the settings and the commands (``notify.cli.docgen``),
so they cannot drift from it. A ``<!-- bench-table: AREA -->`` line in a page becomes the
area's latest benchmark runs, read from ``docs/benchmarks/data/`` (``runs.csv`` and
``AREA.csv``): the figures are kept once, as data.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from notify.cli import main as cli_main
from notify.cli.docgen import BENCH_MARK, bench_tables, cli_markdown, settings_markdown

BENCH_DATA = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "data"

GENERATED = {
    "reference/configuration.md": settings_markdown,
    "reference/cli.md": lambda: cli_markdown(cli_main),
}


def on_files(files: Files, config: Any) -> Files:
    for path, render in GENERATED.items():
        files.append(File.generated(config, path, content=render()))
    return files


def _rows(name: str) -> list[dict[str, str]]:
    with (BENCH_DATA / name).open(newline="") as f:
        return list(csv.DictReader(f))


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    if "bench-table" not in markdown:
        return markdown
    runs = _rows("runs.csv")
    return BENCH_MARK.sub(lambda m: bench_tables(m.group(1), runs, _rows(f"{m.group(1)}.csv")),
                          markdown)
