"""Tables of the ``notify`` CLI that never cut what you must paste.

Keys, transaction ids and dead-letter ids are folded inside their cell (wrapped at the
cell's edge, no character dropped) instead of being cut with an ellipsis; when the terminal
is too narrow for one to stay on a single line, every such id is printed again, whole and
one per line, under the table, ready to copy into ``notify tx commit KEY`` and friends.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text


def new_table(title: str, columns: Sequence[tuple[str, str]], key_column: int | None) -> Table:
    """A table whose column ``key_column`` (an index) holds ids: folded, never cut."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for i, (name, justify) in enumerate(columns):
        if i == key_column:
            table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
        else:
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
    return table


def print_table(
    table: Table, keys: Sequence[str], label: str, console: Console | None = None,
    whole: Sequence[str] | None = None,
) -> None:
    """Print ``table``; then, if any of ``keys`` did not fit on one line of it, all of
    them whole under the heading ``label`` (or the lines ``whole`` instead, e.g. each row
    whose cells are all ids)."""
    out = console or Console()
    for column in table.columns:
        if column.overflow == "fold" and keys and whole is None:  # ids first: others wrap
            column.min_width = min(max(map(len, keys)), out.width // 2)
    with out.capture() as capture:
        out.print(table)
    text = capture.get()
    out.file.write(text)
    lines = Text.from_ansi(text).plain.splitlines()
    if any(not any(k in line for line in lines) for k in keys):
        shown = keys if whole is None else whole
        out.file.write(f"{label} (whole):\n" + "".join(f"{k}\n" for k in shown))
    out.file.flush()
