"""Built-in participants: the broker, PostgreSQL (psycopg), MySQL/MariaDB (PyMySQL),
SQLAlchemy; and :func:`factory_from_url` to make one from a URL (used by ``notify xa``)."""

from __future__ import annotations

import ssl

from notify.errors import ConfigError
from notify.xa.participant import Participant, ParticipantFactory
from notify.xa.resources.broker import BrokerParticipant
from notify.xa.resources.mysql import MySQLParticipant
from notify.xa.resources.postgres import PostgresParticipant

__all__ = ["factory_from_url", "kind_of_url"]


def kind_of_url(url: str) -> str:
    """``"broker"``, ``"postgres"`` or ``"mysql"`` for a participant URL."""
    scheme = url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme in ("postgresql", "postgres"):
        return "postgres"
    if scheme in ("mysql", "mariadb"):
        return "mysql"
    if scheme in ("", "meta", "notify", "broker"):
        return "broker"
    raise ConfigError(f"unsupported participant URL {url!r}")


def factory_from_url(
    url: str, secret: str | None = None, tls: ssl.SSLContext | None = None
) -> ParticipantFactory:
    """A participant factory for ``url``: ``host:port`` / ``meta://host:port`` (broker,
    with the shared ``secret`` and the ``tls`` context when given), ``postgresql://...``
    (psycopg), ``mysql+pymysql://...`` / ``mariadb://...`` (PyMySQL)."""
    kind = kind_of_url(url)
    if kind == "postgres":
        def make_pg() -> Participant:
            return PostgresParticipant(url)

        return make_pg
    if kind == "mysql":
        def make_my() -> Participant:
            return MySQLParticipant(url)

        return make_my
    def make_broker() -> Participant:
        return BrokerParticipant(url, secret=secret, tls=tls)

    return make_broker
