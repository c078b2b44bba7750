"""Every code block of ``docs/`` runs as written (the site itself: ``test_site.py``; the
README's blocks: ``tests/test_readme.py``, by the same runner, :mod:`tests.docs.runner`).

* Every ```` ```python ```` and ```` ```bash ```` block of every page runs, page by page in
  the page's order, against real servers, followed by the checks of what it did
  (:mod:`tests.docs.checks`). A block that cannot run here says so and why, in an HTML
  comment the site does not show, right before it:
  ``<!-- not-runnable: needs a Spark cluster -->``; a block with neither fails.
* Every ```` ```ini ```` block is a ``server.ini`` the broker's own parser accepts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from notify.client import LocalTxState
from notify.config import parse_config
from tests.docs.checks import visible
from tests.docs.runner import (
    DOCS,
    DevDatabases,
    DocBlock,
    dev_db,
    page_blocks,
    page_env,
    run_block,
    run_page,
)

__all__ = ["dev_db"]  # the fixture, for this module

PAGES = sorted(p for p in DOCS.rglob("*.md"))
BLOCKS = {p.relative_to(DOCS).as_posix(): page_blocks(p) for p in PAGES}
RUN_PAGES = sorted(page for page, blocks in BLOCKS.items() if any(b.runs for b in blocks))


def test_every_block_runs_or_says_why_not() -> None:
    """A Python or shell block is run below, or it carries a reason; a marker with no reason
    or on a block that is not Python or shell (where it would mean nothing) is an error."""
    assert len(RUN_PAGES) >= 8
    for blocks in BLOCKS.values():
        for b in blocks:
            if b.not_runnable is not None:
                assert b.not_runnable, f"{b.where}: not-runnable without a reason"
                assert b.lang in ("python", "bash"), f"{b.where}: not-runnable marks a {b.lang}"
    every = [b for blocks in BLOCKS.values() for b in blocks if b.lang in ("python", "bash")]
    ran = [b for b in every if b.runs]
    assert len(ran) >= len(every) // 2, "most examples must run"


def test_the_guides_have_their_examples() -> None:
    """The examples the checks know are still there (a dropped one must be noticed)."""
    code = {page: "".join(b.code for b in blocks if b.runs) for page, blocks in BLOCKS.items()}
    half = code["guides/transactions/half-messages.md"]
    assert "send_in_transaction" in half and "checker" in half
    assert ".half_message(" in half and "key=" in half and "headers=" in half
    assert "TransactionManager(" in code["guides/transactions/xa.md"]
    assert "outbox.relay(session)" in code["guides/transactions/outbox.md"]
    assert "transaction(db=conn)" in code["guides/transactions/outbox.md"]
    assert "send_async(conn" in code["guides/transactions/outbox.md"]
    assert 'producer("returns", db=engine)' in half
    first = code["getting-started/first-transaction.md"]
    assert "dev-db.sh postgres start" in first and 'b"receipt 1" in seen' in first
    assert "initial_offset=" in code["getting-started/first-messages.md"]


@pytest.mark.parametrize(
    "block",
    [b for blocks in BLOCKS.values() for b in blocks if b.lang == "ini"],
    ids=lambda b: b.where,
)
def test_ini_blocks_are_valid_config(block: DocBlock) -> None:
    parse_config(block.code)


@pytest.mark.parametrize("page", RUN_PAGES)
def test_page_blocks_run(
    page: str, tmp_path: Path, dev_db: DevDatabases, request: pytest.FixtureRequest
) -> None:
    run_page(BLOCKS[page], tmp_path, dev_db, request)


def test_half_message_checker_decides(
    tmp_path: Path, dev_db: DevDatabases, request: pytest.FixtureRequest
) -> None:
    """The half-message guide's example with the local transaction's answer lost (UNKNOWN):
    the broker asks the guide's checker, which finds the row paid and commits."""
    (block,) = [
        b for b in BLOCKS["guides/transactions/half-messages.md"]
        if b.runs and "send_in_transaction" in b.code
    ]
    env = page_env([block], tmp_path, dev_db, request)
    code = env.substitute(block.code)
    decided = "return LocalTxState.COMMIT   #"
    assert decided in code
    code = code.replace(decided, f"return LocalTxState.{LocalTxState.UNKNOWN.name}   #")
    code += (  # still inside the session, so the producer is there to answer the check
        "    import time\n"
        "    from notify.client import ConsumerConfig\n"
        "    seen = []\n"
        "    c = session.create_consumer(ConsumerConfig(group='wait', data_dir='wait'))\n"
        "    deadline = time.monotonic() + 30\n"
        "    while b'paid 7' not in seen and time.monotonic() < deadline:\n"
        "        seen += [m.data for m in c.fetch('orders', 0.5)]\n"
        "    assert b'paid 7' in seen, 'the checker did not commit it'\n"
    )
    out = run_block(block, code, env.work, env.environ())
    assert "LocalTxState.UNKNOWN" in out
    assert visible(env.broker.addr, "orders", tmp_path / "check") == [b"paid 7"]
