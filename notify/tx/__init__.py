"""Transactions: state machine, transaction keys and the broker's txlog record bodies.

Pure code (no sockets, no files); the broker's transaction manager
(:mod:`notify.broker.transactions`) and the clients build on it.
"""
