"""A griffe extension (``mkdocs.yml``: mkdocstrings' ``extensions``): the docstrings'
reStructuredText habits (roles, ``::`` literal blocks, simple tables) rendered as Markdown
by ``notify.cli.docgen.rst_to_markdown``, so the API and format pages read as the source does."""

from __future__ import annotations

from typing import Any

import griffe

from notify.cli.docgen import rst_to_markdown


class RstToMarkdown(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
