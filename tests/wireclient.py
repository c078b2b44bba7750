"""The raw wire client of the tests, kept importable here: it lives in :mod:`tests.helpers`
(new tests import it from there)."""

from __future__ import annotations

from tests.helpers import WireClient, crc

__all__ = ["WireClient", "crc"]
