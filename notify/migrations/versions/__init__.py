"""Alembic revisions of notify's tables (ids are stable: ``0001``, ``0002``, ...)."""
