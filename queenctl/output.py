"""What queenctl prints: aligned tables for people, the broker's JSON for scripts."""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click

Column = tuple[str, str | Callable[[dict], Any]]


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return printable(str(value))


def printable(text: str) -> str:
    """Control characters (a tab, an escape sequence in a queue name) shown escaped, so that
    a name cannot break the table or drive the terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode()
                   for ch in text)


def table(rows: Sequence[dict], columns: Sequence[Column], empty: str = "(none)") -> str:
    if not rows:
        return empty
    heads = [h for h, _ in columns]
    body = [[cell(get(row) if callable(get) else _dig(row, get)) for _, get in columns]
            for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(heads, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in body]
    return "\n".join(lines)


def pairs(values: Sequence[tuple[str, Any]]) -> str:
    """``key  value`` lines, keys aligned."""
    width = max((len(k) for k, _ in values), default=0)
    return "\n".join(f"{k.ljust(width)}  {cell(v)}" for k, v in values)


def _dig(row: dict, key: str) -> Any:
    value: Any = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def emit(ctx: click.Context, answer: Any, human: Callable[[Any], str]) -> None:
    """``--json``: the broker's answer as it came; otherwise ``human(answer)``."""
    if ctx.obj.json:
        click.echo(json.dumps(answer, indent=2, ensure_ascii=False))
    else:
        click.echo(human(answer))
