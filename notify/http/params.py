"""Checked request parameters: every bad value becomes a 400 that names it.

Topic names are checked with :func:`notify.config.validate_topic` before anything else sees
them, so a name can never reach the file system as a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from aiohttp import web

from notify.config import validate_topic
from notify.errors import InvalidTopicError

INT32: Final = (-(2**31), 2**31 - 1)
INT64: Final = (-(2**63), 2**63 - 1)
#: Consumer group names: one wire token, printable, no spaces.
_GROUP_RE: Final = re.compile(r"[^\s\x00-\x1f\x7f]{1,255}")


def bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=message)


def topic_name(value: str | None) -> str:
    if value is None or value == "":
        raise bad_request("missing parameter 'topic'")
    try:
        return validate_topic(value)
    except InvalidTopicError as e:
        raise bad_request(str(e)) from None


def group_name(value: str | None, default: str | None = None) -> str:
    if value is None or value == "":
        if default is None:
            raise bad_request("missing parameter 'group'")
        return default
    if not _GROUP_RE.fullmatch(value):
        raise bad_request("invalid group: 1-255 printable characters without spaces")
    return value


def parse_int(raw: object, name: str, lo: int = INT64[0], hi: int = INT64[1]) -> int:
    if isinstance(raw, bool):
        raise bad_request(f"invalid {name}: expected an integer")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and re.fullmatch(r"-?\d{1,20}", raw.strip()):
        value = int(raw)
    else:
        shown = str(raw)[:40]
        raise bad_request(f"invalid {name} {shown!r}: expected an integer")
    if not lo <= value <= hi:
        raise bad_request(f"invalid {name} {value}: must be in {lo}..{hi}")
    return value


def int_param(
    query: Mapping[str, str],
    name: str,
    default: int | None = None,
    lo: int = INT64[0],
    hi: int = INT64[1],
    aliases: tuple[str, ...] = (),
) -> int:
    raw = None
    for key in (name, *aliases):
        raw = query.get(key)
        if raw is not None and raw != "":
            break
    if raw is None or raw == "":
        if default is None:
            raise bad_request(f"missing parameter {name!r}")
        return default
    return parse_int(raw, name, lo, hi)
