"""Compile notify's hot loops (notify/protocol/hotpath.py) with mypyc.

    .venv/bin/python scripts/build_native.py          # build if missing or stale
    .venv/bin/python scripts/build_native.py --force  # build again
    .venv/bin/python scripts/build_native.py --clean  # remove the build (pure Python)

A copy of hotpath.py named ``_hotpath_native`` (so the build never shadows the source),
with ``SOURCE_SHA256`` (the source's hash) appended, is compiled in a temporary directory;
the resulting extension files are moved into notify/protocol/ (renamed into place, so a
running process keeps the file it mapped). notify.protocol.accel uses them only while
hotpath.py still has that hash. Needs mypy (the dev extra), a C compiler and the Python
headers; without them it says so and exits 0: notify then runs its pure-Python code.
Run by scripts/setup.sh (full setup only: the demo does not install mypy).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "notify" / "protocol"
SOURCE = PKG / "hotpath.py"
NAME = "_hotpath_native"
STAMP = PKG / f"{NAME}.sha256"  # the hash the installed build was made from

_SETUP = """\
from setuptools import setup
from mypyc.build import mypycify
setup(
    name="notify-hotpath",
    ext_modules=mypycify(["notify/protocol/{name}.py"], opt_level="3"),
    script_args=["build_ext", "--inplace"],
)
"""


def built_files() -> list[Path]:
    return sorted(PKG.glob(f"{NAME}*.so")) + sorted(PKG.glob(f"{NAME}*.pyd"))


def clean() -> None:
    for f in [*built_files(), STAMP]:
        f.unlink(missing_ok=True)


def build(digest: str) -> None:
    with tempfile.TemporaryDirectory(prefix="notify-mypyc-") as tmp:
        work = Path(tmp)
        pkg = work / "notify" / "protocol"
        pkg.mkdir(parents=True)
        (work / "notify" / "__init__.py").write_text("")
        (pkg / "__init__.py").write_text("")
        src = SOURCE.read_text(encoding="utf-8")
        (pkg / f"{NAME}.py").write_text(
            src + f'\n\nSOURCE_SHA256: Final = "{digest}"\n', encoding="utf-8"
        )
        (work / "setup_native.py").write_text(_SETUP.format(name=NAME))
        env = {**os.environ, "PYTHONPATH": ""}
        r = subprocess.run(
            [sys.executable, "setup_native.py"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
            raise SystemExit(f"build_native: mypyc build failed (exit {r.returncode})")
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        made = sorted(pkg.glob(f"{NAME}*{suffix}"))
        if not made:
            raise SystemExit("build_native: mypyc produced no extension module")
        clean()
        for f in made:
            tmp_dest = PKG / (f.name + ".tmp")
            shutil.copyfile(f, tmp_dest)
            os.replace(tmp_dest, PKG / f.name)
        STAMP.write_text(digest + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="build even if up to date")
    ap.add_argument("--clean", action="store_true", help="remove the build and exit")
    args = ap.parse_args()
    if args.clean:
        clean()
        print("build_native: removed the compiled hot path (pure Python)")
        return 0
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
    if (
        not args.force
        and built_files()
        and STAMP.exists()
        and STAMP.read_text().strip() == digest
    ):
        print("build_native: compiled hot path is up to date")
        return 0
    if importlib.util.find_spec("mypyc") is None:
        print("build_native: mypyc not installed (dev extra): notify runs pure Python")
        return 0
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        print("build_native: no C compiler: notify runs pure Python")
        return 0
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        print("build_native: no Python headers (Debian: python3-dev): notify runs pure Python")
        return 0
    build(digest)
    print(f"build_native: compiled {SOURCE.relative_to(ROOT)} ({digest[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
