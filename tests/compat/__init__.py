"""Compatibility tests: the exact bytes real MetaQ clients send, decoded the way they decode.

Kept apart from the spec tests (``tests/broker``): these say what a deployed client needs,
byte for byte. ``javaclient`` re-states the Java client's encoders and decoders
(``metamorphosis-commons`` / ``metamorphosis-client`` 1.4) in Python; see
``docs/metaq-compat.md``.
"""
