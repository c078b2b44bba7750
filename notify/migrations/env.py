"""Alembic environment of notify's own tables.

Run through :mod:`notify.migrations` (``notify db upgrade``), which hands over an open
connection in ``config.attributes["connection"]``; the plain ``alembic`` command works too
(``alembic -c migrations/alembic.ini -x url=postgresql+psycopg://... upgrade head``).

The version table is ``notify_alembic_version``, not ``alembic_version``: notify's tables
often live in the application's own database, next to the application's own migrations.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from notify.migrations import VERSION_TABLE


def _configure_and_run(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    """Run the migrations on the handed-over connection, or on ``-x url=`` / sqlalchemy.url."""
    config = context.config
    connection = config.attributes.get("connection")
    if isinstance(connection, sa.Connection):
        _configure_and_run(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("give a database: -x url=... or sqlalchemy.url")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            _configure_and_run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) mode is not supported; run against a database")
run()
