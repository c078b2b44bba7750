"""Deterministic simulation: a simulated disk, clock and scheduler.

* :mod:`notify.sim.disk`      :class:`~notify.sim.disk.SimFileSystem`, an in-memory
  :class:`~notify.fs.FileSystem` that keeps only what was fsynced across a crash;
* :mod:`notify.sim.clock`     :class:`~notify.sim.clock.SimClock`, advanced explicitly;
* :mod:`notify.sim.scheduler` :class:`~notify.sim.scheduler.SimScheduler`, seeded callbacks;
* :mod:`notify.sim.storage`   the storage simulation: the real store and redo log on the
  simulated disk, crashed and recovered at random points (``python -m notify.sim.storage``).

Everything here is driven by one :class:`random.Random`, so a seed replays a run exactly.
"""
