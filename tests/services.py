"""Real ZooKeeper, PostgreSQL and MariaDB servers for tests, on loopback, in temp dirs.

Each server runs as a child process of the test session (started directly, not through a
wrapper, so its PID is the server's), on a free ``127.0.0.1`` port, with its data in a
throwaway directory; ``stop()`` signals that PID and waits, ``start()`` brings it back on the
same port and data, ``kill()`` is SIGKILL. The children get ``PR_SET_PDEATHSIG`` so a
test session that dies does not leave servers behind.

The binaries come from ``scripts/services.sh install``. When one is missing,
:func:`require` raises :class:`ServerMissing`; the pytest fixtures in
``tests/services_conftest.py`` turn that into a skip, or into a failure when ``CI`` is set.

Usage without pytest::

    with PostgresServer() as pg:
        url = fresh_database(pg)
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

ZK_JARS = ("/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar")
_PR_SET_PDEATHSIG = 1


class ServerMissing(RuntimeError):
    """The server's binaries are not installed (run ``bash scripts/services.sh install``)."""


class ServerStartError(RuntimeError):
    """The server is installed but did not come up; the message carries its log tail."""


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _port_open(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _die_with_parent(sig: int) -> Any:
    """A preexec_fn asking the kernel to send ``sig`` to the child when we die."""

    def preexec() -> None:  # pragma: no cover - runs in the child
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return preexec


def _is_root() -> bool:
    return os.geteuid() == 0


def _as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments running the child as ``user`` (uid, gid, no extra groups)."""
    if user is None:
        return {}
    pw = pwd.getpwnam(user)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


class _Server:
    """A server child process: start/stop/kill/restart by PID, log tail for errors."""

    name = "server"
    stop_signal = signal.SIGTERM
    start_timeout_s = 60.0

    def __init__(self, workdir: Path | None = None):
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"notify-{self.name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.out_path = self.workdir / f"{self.name}.out"
        self.log_path = self.out_path  # where the server writes its log
        self._log: Any = None
        self._initialized = False

    # -- to implement
    @staticmethod
    def available() -> bool:
        """Whether the server's binaries are installed."""
        return True

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _init(self) -> None:
        """One-time data directory setup (before the first start)."""

    def _ready(self) -> bool:
        raise NotImplementedError

    def _after_first_start(self) -> None:
        """One-time setup once the server answers (create databases...)."""

    def _popen_user(self) -> str | None:
        return None

    # -- lifecycle
    @property
    def pid(self) -> int | None:
        """PID of the running server, None when stopped."""
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    def start(self) -> _Server:
        """Start (first time: on a new free port; later: same port and data)."""
        if self.running:
            return self
        first = not self._initialized
        if first:
            self._init()
            self._initialized = True
        # A free port can be taken by someone else before the server binds it: on the
        # first start, try again on another port.
        for attempt in range(3 if first else 1):
            if not self.port or attempt:
                self.port = free_port()
            try:
                self._start_once()
            except ServerStartError:
                if attempt + 1 >= (3 if first else 1):
                    raise
                continue
            if first:
                self._after_first_start()
            return self
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        self._log = open(self.out_path, "ab")  # noqa: SIM115 - closed in _reap
        self.proc = subprocess.Popen(
            self._command(),
            cwd=self.workdir,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent(self.stop_signal),
            **_as_user(self._popen_user()),
        )
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reap()
                raise ServerStartError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if _port_open(self.port) and self._ready():
                return
            time.sleep(0.05)
        self.kill()
        raise ServerStartError(
            f"{self.name} did not start in {self.start_timeout_s}s:\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Graceful stop by PID; SIGKILL if it does not exit within ``timeout_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reap()
        self._wait_port_closed()

    def kill(self) -> None:
        """SIGKILL the server process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reap()
        self._wait_port_closed()

    def restart(self) -> _Server:
        """Stop then start on the same port and data."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and remove the temp directory (when we created it)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _wait_port_closed(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.port and _port_open(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _reap(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, n: int = 30) -> str:
        """Last ``n`` lines of the server log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- ZooKeeper


class ZooKeeperServer(_Server):
    """A standalone ZooKeeper 3.8; ``connect`` is the kazoo hosts string.

    ``tick_time_ms`` bounds session timeouts to [2, 20] ticks: the default 500 ms gives
    sessions of 1-10 s, so tests waiting for an expiry stay short.
    """

    name = "zookeeper"

    def __init__(self, workdir: Path | None = None, tick_time_ms: int = 500):
        super().__init__(workdir)
        self.tick_time_ms = tick_time_ms

    @staticmethod
    def available() -> bool:
        """Whether the Debian ``zookeeper`` package and java are installed."""
        return all(os.path.exists(j) for j in ZK_JARS) and shutil.which("java") is not None

    @property
    def connect(self) -> str:
        """``127.0.0.1:<port>`` (kazoo ``hosts``)."""
        return f"127.0.0.1:{self.port}"

    def _init(self) -> None:
        (self.workdir / "data").mkdir(exist_ok=True)

    def _command(self) -> list[str]:
        cfg = self.workdir / "zoo.cfg"
        cfg.write_text(
            f"tickTime={self.tick_time_ms}\n"
            f"dataDir={self.workdir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr,stat\n"
            "maxClientCnxns=0\n"
        )
        java = shutil.which("java") or "java"
        return [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.admin.enableServer=false",
            "-cp",
            ":".join(ZK_JARS),
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(cfg),
        ]

    def _ready(self) -> bool:
        # ``ruok`` answers imok while the database is still loading; ``srvr`` tells.
        return self.four_letter(b"srvr").startswith("Zookeeper version")

    def four_letter(self, cmd: bytes) -> str:
        """Send a whitelisted four-letter command (ruok, srvr, stat); '' on failure."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as s:
                s.sendall(cmd)
                chunks = []
                while chunk := s.recv(4096):
                    chunks.append(chunk)
                return b"".join(chunks).decode(errors="replace")
        except OSError:
            return ""


# ---------------------------------------------------------------------------- PostgreSQL


def _pg_bindir() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


class PostgresServer(_Server):
    """PostgreSQL (newest installed major) with ``max_prepared_transactions=64``.

    ``url`` is the SQLAlchemy URL of database ``postgres`` (user ``postgres``, trust auth),
    ``dsn`` the same for psycopg. ``fsync`` is off unless ``durable``: the tests kill
    processes, not the machine, and data in the OS page cache survives a killed server.
    """

    name = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: does not wait for clients

    def __init__(
        self,
        workdir: Path | None = None,
        max_prepared_transactions: int = 64,
        durable: bool = False,
    ):
        super().__init__(workdir)
        self.max_prepared_transactions = max_prepared_transactions
        #: fsync and synchronous_commit on (benchmarks); off by default (tests).
        self.durable = durable
        self.bindir = _pg_bindir()
        if _is_root():
            shutil.chown(self.workdir, "postgres", "postgres")

    @staticmethod
    def available() -> bool:
        """Whether initdb/postgres are installed (and the postgres user when root)."""
        if _pg_bindir() is None:
            return False
        if _is_root():
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return False
        return True

    def _popen_user(self) -> str | None:
        return "postgres" if _is_root() else None

    def url_for(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def dsn_for(self, database: str) -> str:
        """psycopg conninfo of ``database`` on this server."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``postgres`` database."""
        return self.url_for("postgres")

    @property
    def dsn(self) -> str:
        """psycopg conninfo of the ``postgres`` database."""
        return self.dsn_for("postgres")

    def _init(self) -> None:
        assert self.bindir is not None
        data = self.workdir / "data"
        r = subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            cwd=self.workdir,
            capture_output=True,
            **_as_user(self._popen_user()),
            check=False,
        )
        if r.returncode != 0:
            raise ServerStartError(f"initdb failed: {r.stdout.decode()}{r.stderr.decode()}")

    def _command(self) -> list[str]:
        assert self.bindir is not None
        return [
            str(self.bindir / "postgres"),
            "-D",
            str(self.workdir / "data"),
            "-c",
            "listen_addresses=127.0.0.1",
            "-p",
            str(self.port),
            "-c",
            f"unix_socket_directories={self.workdir}",
            "-c",
            f"max_prepared_transactions={self.max_prepared_transactions}",
            "-c",
            "max_connections=200",
            "-c",
            f"fsync={'on' if self.durable else 'off'}",
            "-c",
            f"synchronous_commit={'on' if self.durable else 'off'}",
            "-c",
            f"full_page_writes={'on' if self.durable else 'off'}",
            "-c",
            "shared_buffers=32MB",
        ]

    def _ready(self) -> bool:
        import psycopg

        try:
            c = psycopg.connect(self.dsn, connect_timeout=2, autocommit=True)
        except psycopg.Error:
            return False
        try:
            c.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False
        finally:
            c.close()

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its SQLAlchemy URL."""
        import psycopg
        from psycopg import sql

        c = psycopg.connect(self.dsn, autocommit=True)
        try:
            c.execute(sql.SQL("CREATE DATABASE {} STRATEGY FILE_COPY").format(sql.Identifier(name)))
        finally:
            c.close()
        return self.url_for(name)


# ---------------------------------------------------------------------------- MariaDB


def _which_any(*names: str) -> str | None:
    for n in names:
        p = shutil.which(n) or (f"/usr/sbin/{n}" if os.path.exists(f"/usr/sbin/{n}") else None)
        if p:
            return p
    return None


class MariaDBServer(_Server):
    """MariaDB; ``url`` is ``mysql+pymysql://root@127.0.0.1:<port>/test``.

    Durability is relaxed the same way as PostgreSQL's (safe against killed processes).
    """

    name = "mariadb"

    def __init__(self, workdir: Path | None = None):
        super().__init__(workdir)
        self.log_path = self.workdir / "err.log"
        if _is_root():
            shutil.chown(self.workdir, "mysql", "mysql")

    def _popen_user(self) -> str | None:
        # Started as mysql directly (not --user=mysql): mariadbd's own setuid would clear
        # the parent-death signal.
        return "mysql" if _is_root() else None

    @staticmethod
    def available() -> bool:
        """Whether mariadbd and mariadb-install-db are installed."""
        if _is_root():
            try:
                pwd.getpwnam("mysql")
            except KeyError:
                return False
        return (
            _which_any("mariadbd", "mysqld") is not None
            and _which_any("mariadb-install-db", "mysql_install_db") is not None
        )

    def url_for(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on this server."""
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database}"

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the ``test`` database."""
        return self.url_for("test")

    def _user_args(self) -> list[str]:
        return ["--user=mysql"] if _is_root() else []

    def _init(self) -> None:
        tool = _which_any("mariadb-install-db", "mysql_install_db")
        assert tool is not None
        r = subprocess.run(
            [
                tool,
                "--no-defaults",
                *self._user_args(),
                f"--datadir={self.workdir / 'data'}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            cwd=self.workdir,
            capture_output=True,
            check=False,
        )
        if r.returncode != 0:
            raise ServerStartError(
                f"mariadb-install-db failed: {r.stdout.decode()}{r.stderr.decode()}"
            )

    def _command(self) -> list[str]:
        exe = _which_any("mariadbd", "mysqld")
        assert exe is not None
        w = self.workdir
        return [
            exe,
            "--no-defaults",
            f"--datadir={w / 'data'}",
            f"--socket={w / 'mysqld.sock'}",
            f"--pid-file={w / 'mysqld.pid'}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            "--skip-name-resolve",
            f"--log-error={self.log_path}",
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-doublewrite=0",
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=32M",
            "--max-connections=300",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
        ]

    def _connect(self, database: str | None = None) -> Any:
        import pymysql

        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            database=database,
            connect_timeout=2,
            read_timeout=5,
            write_timeout=5,
            autocommit=True,
        )

    def _ready(self) -> bool:
        import pymysql

        try:
            self._connect().close()
            return True
        except pymysql.MySQLError:
            return False

    def _after_first_start(self) -> None:
        self.create_database("test")

    def create_database(self, name: str) -> str:
        """Create database ``name`` (utf8mb4); returns its SQLAlchemy URL."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()
        return self.url_for(name)


# ---------------------------------------------------------------------------- helpers


class DatabaseServer(Protocol):
    """What :func:`fresh_database` needs."""

    def create_database(self, name: str) -> str: ...


def fresh_database(server: DatabaseServer, prefix: str = "t") -> str:
    """Create a uniquely named database on ``server``; returns its SQLAlchemy URL."""
    return server.create_database(f"{prefix}_{uuid.uuid4().hex[:12]}")


SERVERS: dict[str, type[_Server]] = {
    "zookeeper": ZooKeeperServer,
    "postgres": PostgresServer,
    "mariadb": MariaDBServer,
}


def require(name: str) -> None:
    """Raise :class:`ServerMissing` when server ``name`` is not installed."""
    cls = SERVERS[name]
    if not cls.available():
        raise ServerMissing(f"{name} is not installed (run: bash scripts/services.sh install)")
