"""The JVM options the audit sizes its sessions with are ones this Java accepts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest

from notify.audit.session import (
    LARGE_INPUT_JAVA_OPTIONS,
    SMALL_INPUT_BYTES,
    SMALL_INPUT_JAVA_OPTIONS,
    sizing_conf,
)


@pytest.mark.parametrize("size", [0, SMALL_INPUT_BYTES])
def test_java_options_start_a_jvm_quietly(size: int) -> None:
    """A typo in a ``-XX`` option would stop every audit of that size at start-up (only the
    benchmark reads inputs that large); the compile commands print nothing."""
    java = shutil.which("java")
    if java is None:
        if os.environ.get("CI"):
            pytest.fail("no java on PATH (CI is set: the audit needs it)")
        pytest.skip("no java on PATH")
    opts = sizing_conf(size, 2)["spark.driver.extraJavaOptions"]
    assert opts == (LARGE_INPUT_JAVA_OPTIONS if size else SMALL_INPUT_JAVA_OPTIONS)
    r = subprocess.run(
        [java, *shlex.split(opts), "-version"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "CompileCommand" not in r.stderr
