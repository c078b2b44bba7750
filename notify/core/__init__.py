"""The broker's pure core: transaction states and transition tables, the transaction engine,
the intent -> idempotent apply -> done mechanism shared by commits and delayed-message moves.

No sockets, no asyncio, no threads: collaborators (store, redo log, clock, scheduler) are
passed in explicitly, so the same code runs in the broker and in the deterministic
simulation (:mod:`notify.sim`).
"""
