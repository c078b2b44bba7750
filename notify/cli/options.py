"""Options shared by every ``notify`` command that talks to a broker: its address and the
shared secret and TLS.

The broker's address is one option in every command: ``-s/--server`` (env ``NOTIFY_SERVER``,
default ``127.0.0.1:8123``), the broker's wire address ``host:port`` (``serverPort``).
Commands that call the HTTP admin API (:func:`broker_option`: ``topics``, ``tx``,
``retention``) take the same address and ask the broker over the wire for its HTTP port
(``stats config``: ``dashboardHttpPort``), or take its HTTP URL directly
(``-s http://host:8120``). The older ``-H/--http URL`` (env ``NOTIFY_HTTP``) of those commands
is still accepted, hidden and deprecated. One decorator, :func:`security_options`, adds the
others and hands the command a single ``security: Security`` argument::

    --secret TEXT        the brokers' authSecret        [env var: NOTIFY_SECRET]
    --tls                use TLS (implied by --tls-ca-file / --tls-cert-file)
    --tls-ca-file PATH   CA certificates to trust       [env var: NOTIFY_TLS_CA_FILE]
    --tls-no-verify      do not check the broker's certificate (testing only)
    --tls-cert-file PATH client certificate             [env var: NOTIFY_TLS_CERT_FILE]
    --tls-key-file PATH  its key                        [env var: NOTIFY_TLS_KEY_FILE]
"""

from __future__ import annotations

import configparser
import functools
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import click

from notify.cli.request import request
from notify.client.transport import SECRET_ENV, TransportOptions, tls_context
from notify.errors import NotifyError
from notify.protocol.frames import encode_line

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Security:
    """The secret and TLS settings of one command line."""

    secret: str | None = None
    tls: bool = False
    tls_ca_file: str | None = None
    tls_verify: bool = True
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @property
    def uses_tls(self) -> bool:
        return self.tls or bool(self.tls_ca_file) or bool(self.tls_cert_file)

    def transport(self, connect_timeout_s: float = 5.0) -> TransportOptions:
        """Options for :mod:`notify.client.transport` (raises ``TLSError`` on unreadable files)."""
        return TransportOptions.build(
            self.secret,
            tls=self.tls,
            tls_ca_file=self.tls_ca_file,
            tls_verify=self.tls_verify,
            tls_cert_file=self.tls_cert_file,
            tls_key_file=self.tls_key_file,
            connect_timeout_s=connect_timeout_s,
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for HTTPS calls (None without TLS settings)."""
        if not self.uses_tls:
            return None
        return tls_context(self.tls_ca_file, self.tls_verify, self.tls_cert_file, self.tls_key_file)


_PATH = click.Path(exists=True, dir_okay=False)

#: The broker's wire address (``serverPort``) for every command that talks the protocol.
SERVER_ENV: Final = "NOTIFY_SERVER"
DEFAULT_SERVER: Final = "127.0.0.1:8123"
#: Deprecated: the broker's HTTP address (``dashboardHttpPort``) for the admin commands.
HTTP_ENV: Final = "NOTIFY_HTTP"


def server_option(f: F) -> F:
    """``-s/--server host:port``, env ``NOTIFY_SERVER``: the broker's wire port."""
    opt = click.option(
        "-s",
        "--server",
        envvar=SERVER_ENV,
        show_envvar=True,
        default=DEFAULT_SERVER,
        show_default=True,
        help=SERVER_HELP,
    )
    return opt(f)


SERVER_HELP: Final = "the broker's wire address host:port (serverPort)"


class BrokerAddress:
    """The broker named by ``-s/--server`` for a command that calls the HTTP admin API.

    ``server`` is a wire address ``host:port`` (the HTTP port is asked from the broker, see
    :meth:`http_base`) or an HTTP URL (``http://`` or ``https://``, used as it is)."""

    def __init__(self, server: str) -> None:
        self.server = server

    @property
    def is_url(self) -> bool:
        return "://" in self.server

    def http_base(self, security: Security) -> str:
        """The broker's HTTP base URL; raises :class:`~notify.errors.NotifyError` when the
        broker cannot be asked or has no HTTP port."""
        if self.is_url:
            return self.server
        reply = request(
            self.server, lambda o: encode_line("stats", "config", o), security.transport()
        )
        port = http_port_of(reply.body.decode("utf-8", "replace"))
        if not port:
            raise NotifyError(
                f"the broker at {self.server} has no HTTP port (dashboardHttpPort=0)"
            )
        host = self.server.rpartition(":")[0] or "127.0.0.1"
        return f"{'https' if security.uses_tls else 'http'}://{host}:{port}"


def http_port_of(ini_text: str) -> int:
    """``dashboardHttpPort`` of a ``server.ini`` text (its default 8120 when not set)."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(ini_text)
        value = parser.get("system", "dashboardHttpPort", fallback="8120")
        return int(value.strip())
    except (configparser.Error, ValueError):
        raise NotifyError("cannot read dashboardHttpPort from the broker's config") from None


def deprecated(old: str, new: str) -> None:
    """Say on stderr that ``old`` is a deprecated spelling of ``new`` (it still works)."""
    click.echo(f"notify: {old} is deprecated, use {new}", err=True)


def broker_option(f: F) -> F:
    """``-s/--server`` (env ``NOTIFY_SERVER``) for a command of the HTTP admin API: the
    command gets ``broker: BrokerAddress``. The hidden, deprecated ``-H/--http URL`` (env
    ``NOTIFY_HTTP``) still works: an explicit ``-s`` wins over it, it wins over
    ``NOTIFY_SERVER``; ``-H`` says on stderr that it is deprecated."""

    @functools.wraps(f)
    def wrapper(*args: Any, server: str | None, http_url: str | None, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        explicit = ctx.get_parameter_source("server") == click.core.ParameterSource.COMMANDLINE
        if http_url and not explicit:
            if ctx.get_parameter_source("http_url") == click.core.ParameterSource.COMMANDLINE:
                deprecated("-H/--http", "-s/--server")
            server = http_url
        return f(*args, broker=BrokerAddress(server or DEFAULT_SERVER), **kwargs)

    out: Any = click.option(
        "-H",
        "--http",
        "http_url",
        envvar=HTTP_ENV,
        default=None,
        hidden=True,
        help="deprecated: use -s/--server",
    )(wrapper)
    out = click.option(
        "-s",
        "--server",
        envvar=SERVER_ENV,
        show_envvar=True,
        default=None,
        help="the broker: its wire address host:port (serverPort; the HTTP port is asked "
        "from it) or its HTTP URL  [default: 127.0.0.1:8123]",
    )(out)
    return out  # type: ignore[no-any-return]


def security_options(f: F) -> F:
    """Add ``--secret`` and the ``--tls*`` options; the command gets ``security``."""

    @functools.wraps(f)
    def wrapper(
        *args: Any,
        secret: str | None,
        tls: bool,
        tls_ca_file: str | None,
        tls_no_verify: bool,
        tls_cert_file: str | None,
        tls_key_file: str | None,
        **kwargs: Any,
    ) -> Any:
        security = Security(
            secret or None, tls, tls_ca_file, not tls_no_verify, tls_cert_file, tls_key_file
        )
        return f(*args, security=security, **kwargs)

    opts = [
        click.option(
            "--secret",
            envvar=SECRET_ENV,
            show_envvar=True,
            default=None,
            help="the brokers' shared secret (authSecret)",
        ),
        click.option("--tls", is_flag=True, help="connect with TLS"),
        click.option(
            "--tls-ca-file",
            envvar="NOTIFY_TLS_CA_FILE",
            show_envvar=True,
            type=_PATH,
            default=None,
            help="CA certificates (PEM) to trust; implies --tls",
        ),
        click.option(
            "--tls-no-verify",
            is_flag=True,
            help="do not check the broker's certificate and host name (testing only)",
        ),
        click.option(
            "--tls-cert-file",
            envvar="NOTIFY_TLS_CERT_FILE",
            show_envvar=True,
            type=_PATH,
            default=None,
            help="client certificate (PEM); implies --tls",
        ),
        click.option(
            "--tls-key-file",
            envvar="NOTIFY_TLS_KEY_FILE",
            show_envvar=True,
            type=_PATH,
            default=None,
            help="the client certificate's key (PEM)",
        ),
    ]
    out: Any = wrapper
    for opt in reversed(opts):
        out = opt(out)
    return out  # type: ignore[no-any-return]
