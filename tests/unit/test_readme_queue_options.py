"""The "Queue options" table (docs/reference/queue-options.md) lists exactly the options the broker has
(``QUEUE_OPTIONS`` in broker/store/sql.py), each with its default, so a new, renamed or
re-defaulted option cannot go undocumented."""
from __future__ import annotations

from pathlib import Path

from broker.store.sql import QUEUE_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/reference/queue-options.md"
START, END = "<!-- queue-options:start -->", "<!-- queue-options:end -->"


def table_rows(markdown: str) -> list[tuple[str, str]]:
    """(option, default) of each row of the table between the markers, code quotes removed."""
    assert START in markdown and END in markdown, f"{PAGE.name} lost its queue-options markers"
    table = markdown.split(START, 1)[1].split(END, 1)[0].strip().splitlines()
    assert table[0].startswith("| Option | Default |") and set(table[1]) <= set("|- "), table[:2]
    rows = []
    for line in table[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0].strip("`"), cells[1].strip("`")))
    return rows


def wire_default(value: object) -> str:
    """A default as the table spells it: JSON's ``false``/``true`` for booleans."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_the_table_lists_every_queue_option_with_its_default():
    rows = table_rows(PAGE.read_text())
    names = [name for name, _default in rows]
    assert len(names) == len(set(names)), f"an option is listed twice: {names}"
    assert dict(rows) == {name: wire_default(default)
                          for name, _col, _typ, default in QUEUE_OPTIONS}


def test_the_check_sees_a_missing_option_and_a_wrong_default():
    text = PAGE.read_text()
    first = QUEUE_OPTIONS[0][0]
    rows = dict(table_rows(text.replace(f"| `{first}` |", "| `renamed` |", 1)))
    assert first not in rows and "renamed" in rows
    rows = dict(table_rows(text.replace("| `leaseTime` | `300` |", "| `leaseTime` | `30` |", 1)))
    assert rows["leaseTime"] == "30" != wire_default(dict((n, d) for n, _c, _t, d
                                                          in QUEUE_OPTIONS)["leaseTime"])
