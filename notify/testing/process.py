"""Helpers to run real broker processes from tests, benchmarks and the demo.

:class:`BrokerProcess` writes a ``server.ini`` into a directory, starts
``python -m notify broker start`` as a child process on a free loopback port and knows how to
stop it gracefully (SIGTERM), kill it (SIGKILL) and restart it on the same port and data.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_TOPICS: dict[str, int] = {"test": 4, "orders": 2, "single": 1}


def render_ini(
    data_dir: Path,
    port: int,
    topics: dict[str, int] | dict[str, dict[str, Any]],
    system: dict[str, Any] | None = None,
    slave: dict[str, Any] | None = None,
    zookeeper: dict[str, Any] | None = None,
) -> str:
    """A ``server.ini`` text. ``topics`` maps a name to a partition count or to a dict of
    ``[topic=NAME]`` keys. ``zookeeper``: ``[zookeeper]`` keys, ``zk.`` prefix optional
    (``{"zkEnable": True, "zkConnect": "127.0.0.1:2181", "zkRoot": "/meta"}``)."""
    lines = ["[system]", f"dataPath={data_dir}", f"serverPort={port}", "hostName=127.0.0.1"]
    # dashboardHttpPort=0: no HTTP server unless a test asks for one (notify.http)
    sysvals = {"configWatchInterval": 0, "dashboardHttpPort": 0, **(system or {})}
    lines += [f"{k}={v}" for k, v in sysvals.items()]
    if slave is not None:
        lines.append("[slave]")
        lines += [f"{k}={v}" for k, v in slave.items()]
    if zookeeper is not None:  # configserver
        lines.append("[zookeeper]")
        for k, v in zookeeper.items():
            key = k if k.startswith("zk.") else f"zk.{k}"
            lines.append(f"{key}={str(v).lower() if isinstance(v, bool) else v}")
    for name, spec in topics.items():
        lines.append(f"[topic={name}]")
        if isinstance(spec, int):
            lines.append(f"numPartitions={spec}")
        else:
            lines += [f"{k}={v}" for k, v in spec.items()]
    return "\n".join(lines) + "\n"


class BrokerProcess:
    """A broker in a child process, on 127.0.0.1, with its data under ``workdir``."""

    def __init__(
        self,
        workdir: Path,
        topics: dict[str, int] | dict[str, dict[str, Any]] | None = None,
        system: dict[str, Any] | None = None,
        log_level: str = "info",
        env: dict[str, str] | None = None,
        slave: dict[str, Any] | None = None,
        zookeeper: dict[str, Any] | None = None,
        extra_ini: str = "",
    ):
        self.workdir = Path(workdir)
        #: raw ini text appended to the rendered config (e.g. ``[producerGroup=NAME]``)
        self.extra_ini = extra_ini
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.workdir / "data"
        self.topics = DEFAULT_TOPICS if topics is None else topics
        self.system = dict(system or {})
        self.log_level = log_level
        self.env = dict(env or {})
        self.slave = slave
        self.zookeeper = zookeeper  # [zookeeper] keys (configserver)
        self.config_path = self.workdir / "server.ini"
        self.log_path = self.workdir / "broker.log"
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def http_port(self) -> int:
        """The HTTP port (``dashboardHttpPort``; 0 when HTTP is off)."""
        return int(self.system.get("dashboardHttpPort", 0))

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def write_config(self) -> None:
        self.config_path.write_text(
            render_ini(
                self.data_dir, self.port, self.topics, self.system, self.slave, self.zookeeper
            )
            + self.extra_ini
        )

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        self.write_config()
        ready = self.workdir / "ready.json"
        ready.unlink(missing_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        cmd = [
            sys.executable,
            "-m",
            "notify",
            "broker",
            "start",
            "-c",
            str(self.config_path),
            "--log-level",
            self.log_level,
            "--ready-file",
            str(ready),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready.exists():
                info = json.loads(ready.read_text())
                self.port = int(info["port"])
                return self
            if self.proc.poll() is not None:
                self._reap()
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"broker did not start within {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """Graceful stop (SIGTERM); returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self._reap()

    def wait_exit(self, timeout: float = 20.0) -> int | None:
        """Wait for the process to end by itself (e.g. at a crashpoint)."""
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._reap()

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reap()

    def restart(self, kill: bool = False) -> BrokerProcess:
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()

    def _reap(self) -> int | None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return None if self.proc is None else self.proc.returncode

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
