"""Fixtures of the hostile-client tests: the HTTP face's real broker processes."""

from __future__ import annotations

from tests.http.conftest import http_broker_factory

__all__ = ["http_broker_factory"]
