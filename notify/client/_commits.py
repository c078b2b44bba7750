"""A consumer's offset commits (aiokafka's commit side of ``consumer/group_coordinator.py``):
where each partition starts, and storing how far everything is handled.

A cursor starts at its group's stored offset (:class:`~notify.client.offsets.OffsetStore`;
by default a local file under ``data_dir``), else at the earliest or latest offset
(``initial_offset``). :meth:`OffsetCommitter.commit` stores the ``done`` offset of every
cursor that moved: every ``commit_interval_s``, on ``commit()``, before a rebalance
releases partitions and when the consumer stops (however it stops), so a killed process
re-consumes from its last commit (at-least-once).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid
from pathlib import Path

from notify.errors import ClientError

from ._config import DATA_DIR_ENV, LEGACY_DATA_DIR, MAX_OFFSET, ConsumerConfig, default_data_dir
from ._fetcher import Fetcher
from ._routing import StaticBrokerDirectory, TopicRouter
from ._subscription import ConsumerContext, ConsumerPart, Cursor
from .offsets import FileOffsetStore, OffsetStore, TopicPartitionOffset

log = logging.getLogger("notify.client")


class OffsetCommitter(ConsumerPart):
    """Loads and commits the offsets of one consumer group (see the module docstring).
    ``own_store``: the store was made for this consumer (closed with it)."""

    def __init__(
        self,
        ctx: ConsumerContext,
        store: OffsetStore,
        own_store: bool,
        fetcher: Fetcher,
        router: TopicRouter,
    ):
        super().__init__(ctx)
        self.store, self.own_store = store, own_store
        self.fetcher, self.router = fetcher, router
        #: the offset file's one-time migration (running or done)
        self._migrated: asyncio.Future[None] | None = None
        self._lock: asyncio.Lock | None = None

    async def commit(self) -> None:
        """Store the offsets of everything handled so far (cursors that moved)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            for cursors in self.state.manual.values():
                for cur in cursors:
                    cur.mark_done()
            dirty = [c for c in self.state.all_cursors() if c.dirty and c.done >= 0]
            if not dirty:
                return
            offsets = [
                TopicPartitionOffset(c.topic, str(c.partition), c.done, c.msg_id) for c in dirty
            ]
            for c in dirty:
                c.dirty = False
            try:
                await asyncio.to_thread(self.store.commit, self.group, offsets)
            except BaseException:
                for c in dirty:
                    c.dirty = True
                raise
            self.stats.commits += 1

    async def store_offsets(self, offsets: list[TopicPartitionOffset]) -> None:
        """Store ``offsets`` as they are (a seek before the partitions are read)."""
        await asyncio.to_thread(self.store.commit, self.group, offsets)

    async def init_offset(self, cur: Cursor) -> None:
        """Position a new cursor: the stored offset, else ``initial_offset``."""
        if self._migrated is None:
            self._migrated = asyncio.ensure_future(self._migrate_offsets())
        try:
            await asyncio.shield(self._migrated)
        except ClientError:
            self._migrated = None  # try again with the next partition
            raise
        stored = await asyncio.to_thread(self.store.load, self.group, cur.topic, str(cur.partition))
        if stored is not None:
            cur.position = cur.done = stored.offset
            cur.msg_id = stored.msg_id
            return
        target = 0 if self.config.initial_offset == "earliest" else MAX_OFFSET
        if self.config.initial_offset not in ("earliest", "latest"):
            raise ClientError(
                f"initial_offset must be earliest or latest, not {self.config.initial_offset!r}"
            )
        cur.position = cur.done = await self.fetcher.ask_offset(cur.topic, cur.partition, target)
        cur.dirty = True

    async def _migrate_offsets(self) -> None:
        """Once: re-key a version 1 offset file from broker positions to broker ids."""
        store = self.store
        if not isinstance(store, FileOffsetStore):
            return
        directory = self.router.directory
        positions = directory.legacy_ids() if isinstance(directory, StaticBrokerDirectory) else None
        await asyncio.to_thread(store.migrate_keys, self.group, positions)

    def close(self) -> None:
        """Close the store when it is this consumer's own."""
        if self.own_store:
            self.store.close()


def default_store(config: ConsumerConfig, group: str) -> FileOffsetStore:
    """The offset file of ``group`` under ``config.data_dir`` (offsets of the old default
    directory adopted)."""
    store = FileOffsetStore(Path(config.data_dir) / "offsets")
    _adopt_legacy_offsets(config, store, group)
    return store


def instance_id(cfg: ConsumerConfig) -> str:
    """This instance's stable id (broadcast mode): ``cfg.instance_id``, else the one kept
    in ``<data_dir>/<group>.instance`` (made on first use)."""
    if cfg.instance_id:
        return cfg.instance_id
    path = Path(cfg.data_dir) / f"{cfg.group}.instance"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    iid = f"{os.uname().nodename}-{uuid.uuid4().hex[:12]}".replace(" ", "_")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(iid)
    os.replace(tmp, path)
    return iid


def where(store: OffsetStore, group: str) -> str:
    """Where ``store`` keeps ``group``'s offsets (for the log)."""
    if isinstance(store, FileOffsetStore):
        return str(store.path(group).absolute())
    return repr(store)


def _adopt_legacy_offsets(cfg: ConsumerConfig, store: FileOffsetStore, group: str) -> None:
    """A consumer on the default ``data_dir`` whose group has offsets only in the old
    default (``./.notify-client``, relative to the working directory) takes a copy of them."""
    if Path(cfg.data_dir) != default_data_dir():
        return
    old = FileOffsetStore(LEGACY_DATA_DIR / "offsets").path(group)
    new = store.path(group)
    if new.exists() or not old.is_file():
        return
    new.parent.mkdir(parents=True, exist_ok=True)
    tmp = new.with_name(new.name + ".tmp")
    shutil.copyfile(old, tmp)
    os.replace(tmp, new)
    log.warning(
        "group %s: offsets copied from the old default %s to %s (the default data_dir is "
        "no longer relative to the working directory; set ConsumerConfig.data_dir or %s)",
        group,
        old.absolute(),
        new,
        DATA_DIR_ENV,
    )
