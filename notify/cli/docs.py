"""``notify docs``: preview or build the documentation site (``mkdocs.yml`` at the root of a
checkout; needs the ``docs`` extra, installed by ``scripts/setup.sh``). Loaded lazily by
:mod:`notify.cli`."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import click

from notify.cli.common import EXIT_USAGE, fail

#: the checkout this package runs from (an editable install): mkdocs.yml sits at its root
ROOT = Path(__file__).resolve().parents[1]


def _mkdocs(*args: str) -> None:
    config = ROOT / "mkdocs.yml"
    if not config.is_file():
        fail(f"{config}: not found (the documentation is built from a checkout)", EXIT_USAGE)
    if importlib.util.find_spec("mkdocs") is None:
        fail("mkdocs is not installed: pip install -e '.[docs]' (or bash scripts/setup.sh)")
    cmd = [sys.executable, "-m", "mkdocs", *args, "-f", str(config)]
    sys.exit(subprocess.run(cmd, cwd=ROOT, check=False).returncode)


@click.group("docs")
def docs() -> None:
    """Preview or build the documentation site."""


@docs.command("serve")
@click.option(
    "-a", "--dev-addr", default="127.0.0.1:8000", show_default=True,
    help="address to serve the preview on",
)
def serve(dev_addr: str) -> None:
    """Serve the site locally, rebuilt on every change (mkdocs serve)."""
    _mkdocs("serve", "--dev-addr", dev_addr)


@docs.command("build")
@click.option(
    "-d", "--site-dir", default="site", show_default=True, type=click.Path(file_okay=False),
    help="where the HTML goes",
)
def build(site_dir: str) -> None:
    """Build the site strictly (a broken link or reference fails the build)."""
    _mkdocs("build", "--strict", "--site-dir", str(Path(site_dir).resolve()))
