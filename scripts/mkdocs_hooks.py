"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks``).

The configuration and CLI reference pages do not exist as files: they are generated at
every build from the code that defines the settings and the commands (``notify.docgen``),
so they cannot drift from it.
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

from notify.cli import main as cli_main
from notify.docgen import cli_markdown, settings_markdown

GENERATED = {
    "reference/configuration.md": settings_markdown,
    "reference/cli.md": lambda: cli_markdown(cli_main),
}


def on_files(files: Files, config: Any) -> Files:
    for path, render in GENERATED.items():
        files.append(File.generated(config, path, content=render()))
    return files
