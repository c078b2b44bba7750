"""A slave's consistent cuts in-process (notify.replication.cut): real partitions in a temp
directory; cuts are shown only whole, in order, once every partition holds them; the
remembered cut survives a restart; a damaged file shows nothing rather than a guess."""

from __future__ import annotations

from pathlib import Path

from notify.protocol import records
from notify.replication.cut import (
    CUT_FILE,
    CutFollower,
    encode_cut,
    load_cut,
    parse_cut,
    save_cut,
    start_caps,
)
from notify.store.partition import Partition


def parts(tmp: Path, n: int = 2) -> dict[tuple[str, int], Partition]:
    return {
        ("t", i): Partition.open("t", i, tmp / f"t-{i}", 1 << 20, group_commit=False)
        for i in range(n)
    }


def put(p: Partition, size: int) -> int:
    p.append(records.encode(1, 0, b"x" * size))
    return p.end


def test_a_cut_is_shown_whole_once_every_partition_holds_it(tmp_path: Path) -> None:
    ps = parts(tmp_path)
    a, b = ps[("t", 0)], ps[("t", 1)]
    assert start_caps(ps.values(), {})  # empty partitions: nothing shown before a cut
    f = CutFollower(ps)
    end_a, end_b = put(a, 10), put(b, 10)
    assert a.visible_end == b.visible_end == 0
    f.received_cut({("t", 0): end_a, ("t", 1): end_b + 30})  # b's cut is further than b
    assert a.visible_end == b.visible_end == 0 and f.applied == 0
    put(b, 10)
    assert f.try_apply() == 1
    assert (a.visible_end, b.visible_end) == (end_a, end_b + 30)
    # later cuts apply in order: the second waits for the first
    f.received_cut({("t", 0): end_a + 30})
    f.received_cut({("t", 1): end_b + 60})
    put(b, 10)
    assert f.try_apply() == 0 and b.visible_end == end_b + 30
    put(a, 10)
    assert f.try_apply() == 2
    assert (a.visible_end, b.visible_end) == (end_a + 30, end_b + 60)
    assert f.current == {("t", 0): end_a + 30, ("t", 1): end_b + 60}


def test_the_remembered_cut_survives_and_a_damaged_one_shows_nothing(tmp_path: Path) -> None:
    ps = parts(tmp_path / "data")
    for p in ps.values():
        put(p, 10)
        put(p, 10)
    save_cut(tmp_path, {("t", 0): 30, ("t", 1): 60})
    remembered = load_cut(tmp_path)
    assert remembered == {("t", 0): 30, ("t", 1): 60}
    assert start_caps(ps.values(), remembered)
    assert [p.visible_end for p in ps.values()] == [30, 60]
    raw = (tmp_path / CUT_FILE).read_bytes()
    (tmp_path / CUT_FILE).write_bytes(raw.replace(b"t 1 60", b"t 1 61"))
    assert load_cut(tmp_path) == {}
    # without a remembered cut, partitions that hold data show it all (an older version's
    # slave, or one promoted before), empty ones nothing
    fresh = parts(tmp_path / "other", 3)
    put(fresh[("t", 0)], 10)
    start_caps(fresh.values(), {})
    assert [p.cut for p in fresh.values()] == [None, 0, 0]
    assert fresh[("t", 0)].visible_end == 30


def test_cut_bodies() -> None:
    body = encode_cut([("t", 0, 30), ("u", 3, 7)])
    assert body == b"t 0 30\nu 3 7\n"
    assert parse_cut(body) == {("t", 0): 30, ("u", 3): 7}
    assert parse_cut(b"") == {}
