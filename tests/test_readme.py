"""The README: its code blocks run as written, by the documentation's block runner
(:mod:`tests.docs.runner`: the same servers, substitutions and checks of what each block
did), and it stays the short product page it is meant to be.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.runner import README, DevDatabases, dev_db, page_blocks, run_page

__all__ = ["dev_db"]  # the fixture, for this module

TEXT = README.read_text()
BLOCKS = page_blocks(README)
TWO_COMMANDS = (
    "./scripts/demo.sh    # set up .venv, then run a broker + producer/consumer + transactions"
    " (no ZooKeeper, no DB)\n"
    "./scripts/test.sh    # set up .venv (and the test servers), then run lint, types and the"
    " whole test suite\n"
)


def test_readme_is_a_product_page() -> None:
    """At most 250 lines, opening with the two commands (``.ci/run`` calls the second), the
    three examples, the transaction-mode table, the docs and one benchmark table with its
    command; no words about how the project was made."""
    assert len(TEXT.splitlines()) <= 250
    first = BLOCKS[0]
    assert first.lang == "bash" and first.code == TWO_COMMANDS and first.line <= 5
    run = [b for b in BLOCKS if b.runs]
    assert any("producer.send(" in b.code for b in run)
    assert any("outbox.send(conn" in b.code and "outbox.relay(session)" in b.code for b in run)
    assert any("consumer.messages(" in b.code for b in run)
    modes = ("outbox", "half message", "local transaction", "XA", "transactional consumer",
             "queue inbox")
    table = TEXT[TEXT.index("## Which transaction mode") :]
    assert all(m in table for m in modes)
    assert "bench/targets.py" in TEXT and "notify docs serve" in TEXT
    for word in (r"\bagents?\b", r"\bissue #?\d", r"#\d{2}\b", r"\.ci/run", r"this session"):
        assert not re.search(word, TEXT, re.I), word
    # the raw-protocol examples need nothing a fresh Debian lacks (no nc)
    assert not any(re.search(r"\|\s*nc\b", b.code) for b in BLOCKS)


def test_readme_links_exist() -> None:
    """Every relative link of the README names a file of the checkout."""
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", TEXT):
        assert (README.parent / target).exists(), target


def test_readme_blocks_run(
    tmp_path: Path, dev_db: DevDatabases, request: pytest.FixtureRequest
) -> None:
    ran = run_page(BLOCKS, tmp_path, dev_db, request)
    assert len(ran) >= 3
