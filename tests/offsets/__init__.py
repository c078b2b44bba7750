"""Tests of notify.offsets, notify.migrations and the db/offsets CLI."""
