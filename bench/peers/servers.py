"""Peer servers for the benchmark: Redis 7 and RabbitMQ 3.10 on 127.0.0.1, in temp dirs.

Each server is a child process in its own session (a Ctrl-C in the terminal reaches only this
script, which then stops the servers itself). Stops go by PID (``redis-cli shutdown``,
``rabbitmqctl stop``, then SIGTERM/SIGKILL of the recorded PID, ``epmd -kill`` on our own
EPMD port); :func:`cleanup_all` runs at exit and from the signal handlers, so no server
outlives the benchmark.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import FrameType

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
_LIVE: list[PeerServer] = []
#: set by Ctrl-C / SIGTERM / SIGHUP; checked between scenarios, so a client library that
#: swallows the KeyboardInterrupt (or the task cancellation) cannot keep the run going
STOP = threading.Event()


def check_stop() -> None:
    if STOP.is_set():
        raise KeyboardInterrupt("stop requested")


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads) from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_stop()
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise RuntimeError(f"server exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port} within {timeout}s")


class PeerServer:
    name = "peer"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _spawn(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = open(self.workdir / "server.out", "ab")  # noqa: SIM115 - owned by the child
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            log.close()
        _LIVE.append(self)

    def stop(self) -> None:
        raise NotImplementedError

    def _kill_pid(self, grace: float) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisServer(PeerServer):
    name = "redis"

    def __init__(self, workdir: Path, appendfsync: str):
        super().__init__(workdir)
        self.appendfsync = appendfsync

    def start(self) -> RedisServer:
        self.port = free_port()
        self._spawn(
            [
                shutil.which("redis-server") or "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.workdir),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                self.appendfsync,
                "--daemonize",
                "no",
                "--logfile",
                str(self.workdir / "redis.log"),
            ]
        )
        assert self.proc is not None
        _wait_port(self.port, self.proc, 10, self.workdir / "redis.log")
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._kill_pid(0)
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "shutdown", "nosave"],
                capture_output=True,
                timeout=10,
            )
        self._kill_pid(5)


class RabbitServer(PeerServer):
    name = "rabbitmq"

    def __init__(self, workdir: Path):
        super().__init__(workdir)
        self.nodename = ""
        self.epmd_port = 0
        self.env: dict[str, str] = {}

    def start(self, timeout: float = 60) -> RabbitServer:
        w = self.workdir
        self.port = free_port()
        dist = free_port()
        self.epmd_port = free_port()
        self.nodename = f"notifybench{self.port}@localhost"
        (w / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        (w / "enabled_plugins").write_text("[].\n")
        for d in ("home", "mnesia", "log"):
            (w / d).mkdir(exist_ok=True)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(w / "home"),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(dist),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_MNESIA_BASE": str(w / "mnesia"),
            "RABBITMQ_LOG_BASE": str(w / "log"),
            "RABBITMQ_CONFIG_FILE": str(w / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(w / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(w / "rabbit.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        self._spawn([str(RABBIT_BIN / "rabbitmq-server")], env=self.env)
        assert self.proc is not None
        _wait_port(self.port, self.proc, timeout, w / "server.out")
        return self

    @property
    def beam_pid(self) -> int:
        """The Erlang VM (the scripts exec into it, so normally the child itself)."""
        with contextlib.suppress(OSError, ValueError):
            return int((self.workdir / "rabbit.pid").read_text().split()[0])
        return self.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.nodename, "stop"],
                    env=self.env,
                    capture_output=True,
                    timeout=30,
                )
        self._kill_pid(10)
        if self.epmd_port:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    ["epmd", "-port", str(self.epmd_port), "-kill"],
                    env=self.env,
                    capture_output=True,
                    timeout=10,
                )
            self.epmd_port = 0


class NatsServer(PeerServer):
    """nats-server with JetStream (file storage under the work dir)."""

    name = "nats"

    def start(self, timeout: float = 20) -> NatsServer:
        self.port = free_port()
        conf = self.workdir / "nats.conf"
        conf.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            f"jetstream {{ store_dir: {json.dumps(str(self.workdir / 'js'))} }}\n"
        )
        self._spawn([shutil.which("nats-server") or "nats-server", "-c", str(conf)])
        assert self.proc is not None
        _wait_port(self.port, self.proc, timeout, self.workdir / "server.out")
        return self

    def stop(self) -> None:
        self._kill_pid(10)  # SIGTERM by PID: a clean shutdown


def cleanup_all() -> None:
    for s in list(_LIVE):
        with contextlib.suppress(Exception):
            s.stop()


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    STOP.set()
    raise KeyboardInterrupt(f"signal {signum}")


def install_cleanup() -> None:
    """Stop every peer server at exit, on Ctrl-C, SIGTERM and SIGHUP."""
    atexit.register(cleanup_all)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)


def have_redis() -> bool:
    return shutil.which("redis-server") is not None


def have_nats() -> bool:
    return shutil.which("nats-server") is not None


def have_rabbitmq() -> bool:
    return (RABBIT_BIN / "rabbitmq-server").exists()
