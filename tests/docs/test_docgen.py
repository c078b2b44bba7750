"""The reference generators (``notify.cli.docgen``) on their own, without building the site."""

from __future__ import annotations

import dataclasses
from operator import attrgetter

import click

from notify.cli import main as cli_main
from notify.cli.docgen import cli_markdown, default_cell, rst_to_markdown, settings_markdown
from notify.config import (
    EXTENSION_KEYS,
    SECTIONS,
    SYSTEM_KEYS,
    TOPIC_KEYS,
    ZOOKEEPER_KEYS,
    parse_config,
    settings,
)


def test_every_setting_is_documented_once_with_a_known_type() -> None:
    """settings() is the parser's own list: the same keys, each with a meaning and a type
    the reference can name, and defaults equal to what an empty server.ini parses to."""
    items = settings()
    by_section: dict[str, list[str]] = {}
    for s in items:
        by_section.setdefault(s.section, []).append(s.key)
        assert s.doc.strip(), f"[{s.section}] {s.key} has no description"
        assert s.kind != "string" or s.default is None or isinstance(s.default, str), s.key
    assert tuple(by_section["system"]) == SYSTEM_KEYS
    assert tuple(by_section["zookeeper"]) == ZOOKEEPER_KEYS
    assert tuple(by_section["topic"]) == TOPIC_KEYS
    assert set(by_section) == set(SECTIONS)
    parsed = parse_config("")
    for s in items:
        if (s.section, s.key) == ("system", "dataPath"):  # resolved against the ini's dir
            assert parsed.system.data_path.name == str(s.default)
        elif s.section == "system":
            assert attrgetter(s.attr)(parsed.system) == s.default, s.key
        if s.section == "zookeeper":
            assert getattr(parsed.zookeeper, s.attr) == s.default, s.key


def test_extension_keys_are_every_key_metaq_does_not_know() -> None:
    assert {"halfCommitEarlyAck", "idleTimeout", "queueLockTimeout", "store"} <= EXTENSION_KEYS
    assert not {"brokerId", "deletePolicy", "flushTxLogAtCommit", "zk.zkRoot"} & EXTENSION_KEYS


def test_settings_page_lists_every_key_with_its_anchor_and_default() -> None:
    page = settings_markdown()
    for s in settings():
        assert f'<span id="{s.section}.{s.key}"></span>`{s.key}`' in page
    sizes = {s.key: s for s in settings() if s.section == "system"}
    assert default_cell(sizes["writeBufferSize"]) == "`4194304` (4 MiB)"
    assert default_cell(sizes["idleTimeout"]) == "`300000` (5 min)"
    assert default_cell(sizes["deletePolicy"]) == "`delete,168`"
    assert default_cell(sizes["authSecret"]) == "*(empty)*"
    # a topic key that inherits points at the [system] key it inherits
    assert "Inherits `[system]` [`numPartitions`](#system.numPartitions)" in page


def test_a_new_setting_reaches_the_page() -> None:
    """The page is rendered from the declarations: a setting added there is listed."""
    extra = dataclasses.replace(settings()[0], key="brandNewKey", doc="Something new.")
    assert "`brandNewKey`" in settings_markdown([*settings(), extra])


def test_cli_page_covers_every_command() -> None:
    page = cli_markdown(cli_main)
    ctx = click.Context(cli_main, info_name="notify")
    for name in cli_main.list_commands(ctx):
        assert f"## `notify {name}`" in page or f"### `notify {name}`" in page, name
    assert "`notify dlq replay`" in page and "NOTIFY_SERVER" in page
    assert "`notify queue dlq" not in page and "--http" not in page  # deprecated, hidden


def test_rst_habits_become_markdown() -> None:
    text = (
        "Uses :class:`~notify.client.Producer` and :mod:`.frames`.\n"
        "\n"
        "Layout::\n"
        "\n"
        "    offset  size\n"
        "    0       4\n"
        "\n"
        "After.\n"
        "\n"
        "====  ====\n"
        "a     b\n"
        "====  ====\n"
        "x     y\n"
        "====  ====\n"
    )
    out = rst_to_markdown(text)
    assert "``notify.client.Producer``" in out and "``frames``" in out
    assert "Layout:\n\n```text\noffset  size\n0       4\n```" in out
    assert "```text\n====  ====\na     b\n====  ====\nx     y\n====  ====\n```" in out
    assert "After." in out and "::" not in out
