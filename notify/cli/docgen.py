"""Reference pages generated from the code that defines them, so the documentation site
cannot drift from it (used by ``scripts/mkdocs_hooks.py`` when the site is built).

* :func:`settings_markdown`: every ``server.ini`` key from :func:`notify.config.settings`;
* :func:`cli_markdown`: every ``notify`` command and option from the click tree;
* :func:`rst_to_markdown`: the reStructuredText habits of the docstrings (roles, ``::``
  literal blocks, simple tables) turned into Markdown for the API and format pages.

Pure functions over the code: no files written here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Final

import click

from notify.config import SECTIONS, Setting, settings

KIB: Final = 1024

_SECTION_TITLES: Final[dict[str, str]] = {
    "system": "[system]",
    "zookeeper": "[zookeeper]",
    "slave": "[slave]",
    "topic": "[topic=NAME]",
    "producerGroup": "[producerGroup=NAME]",
}
_SECTION_INTROS: Final[dict[str, str]] = {
    "system": "The broker's own settings. Keys follow MetaQ's names; a key marked *notify* is "
    "an extension MetaQ does not know (`stats config` serves it commented out, so a MetaQ "
    "slave can load the file).",
    "zookeeper": "Cluster mode. Without ZooKeeper (the default) an embedded in-process "
    "backend stands in and clients use static broker addresses.",
    "slave": "Present = this broker is an asynchronous slave of the master with the same "
    "`brokerId` (MetaQ's `async_slave.properties`). A slave also needs `replicationSecret`.",
    "topic": "One section per topic. A key left out inherits the `[system]` key of the same "
    "name; new topics and changed keys apply without a restart (`notify config reload`, "
    "`SIGHUP` or the file watch). Names: `[A-Za-z0-9._-]{1,249}`; names starting with `__` "
    "belong to the broker's internal topics and are refused.",
    "producerGroup": "A producer group whose `register` needs a secret: only producers that "
    "know it may join the group and answer its half messages' check-backs.",
}


def _human(value: int, unit: str) -> str:
    """``4194304`` bytes -> ``4 MiB``; ``300000`` ms -> ``5 min``; empty when not rounder."""
    if unit == "bytes":
        for size, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (KIB, "KiB")):
            if value >= size and value % size == 0:
                return f"{value // size} {name}"
        return ""
    if unit == "ms" and value >= 1000 and value % 1000 == 0:
        s = value // 1000
        for size, name in ((86400, "d"), (3600, "h"), (60, "min")):
            if s >= size and s % size == 0:
                return f"{s // size} {name}"
        return f"{s} s"
    return ""


def default_cell(s: Setting) -> str:
    """The default as the reference shows it: the ini text, plus a readable size or time."""
    text = s.default_text
    if text == "":
        return "*(empty)*" if s.kind in ("string", "secret", "host names") else "*(unset)*"
    out = f"`{text}`"
    if isinstance(s.default, int) and not isinstance(s.default, bool):
        human = _human(s.default, s.unit)
        if human:
            out += f" ({human})"
    return out


def _type_cell(s: Setting) -> str:
    kind = s.kind
    if s.unit:
        kind += f", {s.unit}"
    if s.choices:
        kind += ": " + " \\| ".join(f"`{c}`" for c in s.choices)
    if s.range is not None:
        lo, hi = s.range
        kind += f" ({_bound(lo, s.unit)}..{_bound(hi, s.unit)})"
    return kind


def _bound(value: int, unit: str) -> str:
    return _human(value, unit) or f"{value:,}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(items: Iterable[Setting]) -> Iterator[str]:
    yield "| key | type | default | meaning |"
    yield "|---|---|---|---|"
    for s in items:
        anchor = f'<span id="{s.section}.{s.key}"></span>'
        mark = "" if s.metaq or s.section == "producerGroup" else " *notify*"
        doc = s.doc
        if s.inherited:
            doc = f"Inherits `[system]` [`{s.key}`](#system.{s.key}). {doc}"
        yield (
            f"| {anchor}`{s.key}`{mark} | {_cell(_type_cell(s))} | {default_cell(s)} "
            f"| {_cell(doc)} |"
        )


def settings_markdown(items: Iterable[Setting] | None = None) -> str:
    """The configuration reference page: one table per section (``[system]`` grouped by
    subject), every key with its type, range or choices, default and meaning."""
    all_items = list(settings() if items is None else items)
    out = [
        "# Configuration reference",
        "",
        "`server.ini` in MetaQ's format. **Unknown keys and sections are rejected** with the "
        "section and key named; every value is type-checked and every number range-checked "
        "(the error names the section, key, value and range); relative paths are resolved "
        "against the ini file's directory. A bad edit is refused by `notify config reload`, "
        "`SIGHUP` and the file watch, and the running config stays.",
        "",
        "This page is generated from the declarations in `notify/config.py` "
        "(`notify.config.settings()`).",
        "",
    ]
    for section in SECTIONS:
        rows = [s for s in all_items if s.section == section]
        if not rows:
            continue
        out += [f"## `{_SECTION_TITLES.get(section, section)}`", "", _SECTION_INTROS[section], ""]
        groups: dict[str, list[Setting]] = {}
        for s in rows:
            groups.setdefault(s.group, []).append(s)
        for group, members in groups.items():
            if len(groups) > 1:
                out += [f"### {group}", ""]
            out += [*_rows(members), ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- CLI


def _commands(ctx: click.Context) -> Iterator[click.Context]:
    """``ctx`` and the contexts of every command under it, depth first, by name."""
    yield ctx
    cmd = ctx.command
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _commands(click.Context(sub, info_name=name, parent=ctx))


def _escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def cli_markdown(root: click.Command, name: str = "notify") -> str:
    """The CLI reference page: every command with its usage, help and options, read from
    the click tree (lazily loaded groups included)."""
    out = [
        "# CLI reference",
        "",
        f"Every `{name}` command and option, generated from the command line's own "
        f"definitions (the same text as `{name} COMMAND --help`). Exit codes: 0 ok, 1 runtime "
        "failure (broker unreachable, error reply), 2 usage or configuration error.",
        "",
    ]
    top = click.Context(root, info_name=name)
    for ctx in _commands(top):
        cmd = ctx.command
        path = ctx.command_path
        level = min(2 + path.count(" "), 4) if ctx is not top else 2
        pieces = " ".join(cmd.collect_usage_pieces(ctx))
        out += [f"{'#' * level} `{path}`", ""]
        help_text = _dedent(cmd.help or cmd.short_help or "")
        if help_text:
            out += [help_text, ""]
        out += ["```text", f"Usage: {path} {pieces}".rstrip(), "```", ""]
        options = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option)]
        records = [(p, p.get_help_record(ctx)) for p in options]
        shown = [(p, r) for p, r in records if r is not None and p.name != "help"]
        if shown:
            out += ["| option | meaning |", "|---|---|"]
            for _p, (opts, text) in shown:
                out.append(f"| `{_cell(opts)}` | {_cell(_escape(text))} |")
            out.append("")
        if isinstance(cmd, click.Group):
            subs = cmd.list_commands(ctx)
            if subs:
                out += ["Commands: " + ", ".join(f"`{n}`" for n in subs) + ".", ""]
    return "\n".join(out)


def _dedent(text: str) -> str:
    lines = text.strip("\n").splitlines()
    indents = [len(ln) - len(ln.lstrip()) for ln in lines[1:] if ln.strip()]
    cut = min(indents, default=0)
    body = [lines[0].strip()] + [ln[cut:] for ln in lines[1:]] if lines else []
    return rst_to_markdown("\n".join(body))


# --------------------------------------------------------------------------- docstrings

_ROLE: Final = re.compile(
    r":(?:py:)?(?:mod|class|func|meth|data|attr|exc|obj|const):`~?\.?([^`]+)`"
)
_TABLE_RULE: Final = re.compile(r"^\s*=+(\s+=+)+\s*$")


def rst_to_markdown(text: str) -> str:
    """Docstring text written with reStructuredText habits, as Markdown: roles become code
    spans, a paragraph ending in ``::`` introduces a fenced literal block (the indented
    lines after it), and a simple table (``====  ====`` rules) becomes a fenced block as
    written. Everything else (``double backticks``, lists, plain text) is already Markdown.
    """
    text = _ROLE.sub(lambda m: f"``{m.group(1)}``", text)
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _TABLE_RULE.match(line):
            j = i + 1
            rules = 1
            while j < len(lines) and rules < 3:
                if _TABLE_RULE.match(lines[j]):
                    rules += 1
                j += 1
            indent = len(line) - len(line.lstrip())
            out += ["```text", *(ln[indent:] for ln in lines[i:j]), "```"]
            i = j
            continue
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            stripped = line.rstrip()[:-2].rstrip()
            if stripped:
                out.append(stripped + ":")
            base = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            block: list[str] = []
            while j < len(lines) and (
                not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > base
            ):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
            if block:
                cut = min(len(b) - len(b.lstrip()) for b in block if b.strip())
                out += ["", "```text", *(b[cut:] for b in block), "```", ""]
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


# --------------------------------------------------------------------------- benchmarks

#: ``<!-- bench-table: AREA -->`` in a page: the area's latest runs, from the CSV files.
BENCH_MARK: Final = re.compile(r"<!--\s*bench-table:\s*([\w-]+)\s*-->")
MACHINE: Final = (
    "2 vCPU AMD EPYC VM, 24 GiB, ext4 on a virtual disk, Debian 12, Python 3.11.7 + uvloop; "
    "the load generators share the two cores with the servers"
)


def _number(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return text
    if value == int(value) and abs(value) >= 1000:
        return f"{int(value):,}"
    return text


def _merge_ranges(header: list[str], row: dict[str, str]) -> list[tuple[str, str]]:
    """Columns ``X_low``/``X_high`` (or ``low``/``high``) as one ``X`` cell ``low-high``."""
    out: list[tuple[str, str]] = []
    for col in header:
        if col.endswith("high") and (col[:-4] + "low") in header:
            continue
        if col.endswith("low") and (col[:-3] + "high") in header:
            name = col[:-3].rstrip("_") or "value"
            lo, hi = row[col], row[col[:-3] + "high"]
            cell = _number(lo) if lo == hi or not hi else f"{_number(lo)}-{_number(hi)}"
            out.append((name, cell))
        else:
            out.append((col, _number(row[col])))
    return out


def bench_tables(area: str, runs: list[dict[str, str]], data: list[dict[str, str]]) -> str:
    """The latest runs of ``area`` (every run of its newest date) as Markdown tables, each
    under a line with its date, commit, load and the command that made it."""
    mine = [r for r in runs if r["area"] == area]
    if not mine:
        raise ValueError(f"no benchmark runs for area {area!r}")
    newest = max(r["date"] for r in mine)
    out: list[str] = []
    for run in (r for r in mine if r["date"] == newest):
        rows = [d for d in data if d["run"] == run["run"]]
        if not rows:
            raise ValueError(f"benchmark run {run['run']!r} has no data")
        when = " ".join(x for x in (run["date"], run["time_utc"] and run["time_utc"] + " UTC"))
        facts = [when.strip()]
        if run["commit"]:
            facts.append(f"commit `{run['commit']}`")
        if run["load"]:
            facts.append(f"load average {run['load']}")
        note = run["note"][:1].upper() + run["note"][1:]
        out += [f"*{', '.join(facts)}*: `{run['command']}`" + (f". {note}." if note else ""), ""]
        header = [c for c in rows[0] if c != "run"]
        cells = [_merge_ranges(header, r) for r in rows]
        names = [n for n, _ in cells[0]]
        out.append("| " + " | ".join(n.replace("_", " ") for n in names) + " |")
        out.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(names))) + "|")
        for row in cells:
            out.append("| " + " | ".join(_cell(v) for _, v in row) + " |")
        out.append("")
    return "\n".join(out)
