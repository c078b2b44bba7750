"""Options shared by every ``notify`` command that talks to a broker: its address and the
shared secret and TLS. The address has one form per port, each with its environment
variable: :func:`server_option` (``-s/--server host:port``, ``NOTIFY_SERVER``, the wire port)
and :func:`http_option` (``-H/--http URL``, ``NOTIFY_HTTP``, the HTTP port). One decorator,
:func:`security_options`, adds the others and hands the command a single
``security: Security`` argument::

    --secret TEXT        the brokers' authSecret        [env var: NOTIFY_SECRET]
    --tls                use TLS (implied by --tls-ca-file / --tls-cert-file)
    --tls-ca-file PATH   CA certificates to trust       [env var: NOTIFY_TLS_CA_FILE]
    --tls-no-verify      do not check the broker's certificate (testing only)
    --tls-cert-file PATH client certificate             [env var: NOTIFY_TLS_CERT_FILE]
    --tls-key-file PATH  its key                        [env var: NOTIFY_TLS_KEY_FILE]
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import click

from notify.client.transport import SECRET_ENV, TransportOptions, tls_context

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
#: The broker's HTTP address (``dashboardHttpPort``) for the admin commands.
HTTP_ENV: Final = "NOTIFY_HTTP"
DEFAULT_HTTP: Final = "http://127.0.0.1:8120"


def server_option(f: F) -> F:
    """``-s/--server host:port``, env ``NOTIFY_SERVER``: the broker's wire port."""
    opt = click.option(
        "-s",
        "--server",
        envvar=SERVER_ENV,
        show_envvar=True,
        default=DEFAULT_SERVER,
        show_default=True,
        help="the broker's wire address host:port (serverPort)",
    )
    return opt(f)


def http_option(f: F) -> F:
    """``-H/--http URL``, env ``NOTIFY_HTTP``: the broker's HTTP port."""
    opt = click.option(
        "-H",
        "--http",
        "http_url",
        envvar=HTTP_ENV,
        show_envvar=True,
        default=DEFAULT_HTTP,
        show_default=True,
        help="the broker's HTTP address (dashboardHttpPort)",
    )
    return opt(f)


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
