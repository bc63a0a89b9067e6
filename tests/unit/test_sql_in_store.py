"""Only ``broker/store/`` speaks to PostgreSQL (ARCHITECTURE.md), checked on the
source of ``broker/`` (outside ``broker/store/``), ``actors/`` and ``queenctl/``:

* no connection or pool call: ``<x>.execute / executemany / fetch / fetchrow / fetchval /
  copy_records_to_table / copy_to_table / copy_from_table / copy_from_query /
  transaction(...)``, ``<pool>.acquire(...)`` / ``<pool>.release(...)``, and no
  ``asyncpg.connect`` / ``asyncpg.create_pool`` (whatever the alias);
* no string that is an SQL statement: ``SELECT .. FROM``, ``INSERT INTO``, ``UPDATE .. SET``,
  ``DELETE FROM``, DDL (``CREATE / DROP / ALTER / TRUNCATE TABLE|SCHEMA|..``), ``ON
  CONFLICT``, or a call of an advisory-lock function (``pg_advisory_lock(``,
  ``pg_try_advisory_xact_lock(``, ...).

Precision (what is not a violation, on purpose):

* a call whose receiver is a name the module imported (``reads.fetch(ctx.store, ..)``,
  ``service.transaction(..)``) calls a module's function, not a connection's method;
* asyncpg's ``prepare`` and ``cursor`` are left out: the names are too common
  (``riders.prepare(ctx, ..)`` on a Riders object), and a prepared statement or a cursor
  needs a connection, whose acquisition or ``asyncpg.connect`` is caught;
* ``acquire`` / ``release`` count only on a receiver that names a pool
  (``self._store.pool.acquire``) or as ``async with x.acquire(..)``: a file lock's or an
  asyncio lock's ``acquire()`` is not a database call;
* names are matched whole: ``run_in_executor``, ``executor``, ``fetch_all`` are other names;
* docstrings (any string that is a statement of its own) are documentation, never sent:
  they may quote SQL. Every other string is checked, f-strings as a whole. SQL keywords
  count in capitals (the project writes its SQL so), or in any case when the string
  starts with a statement (``select ..``, ``delete from ..``); English in lower or mixed
  case ("Failed to create schema on target") is not SQL.

Known blind spots: a method reached by ``getattr``; a parameter that shadows an imported
name; an awaited ``acquire`` on a pool held under a name without "pool" in it (outside
``async with``); SQL in lower case that does not start the string. ``test_the_rule_sees_each_kind_of_violation`` shows the rule failing on
a small synthetic source.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("broker", "actors", "queenctl")
STORE = ROOT / "broker" / "store"

CONNECTION_METHODS = frozenset({
    "execute", "executemany", "fetch", "fetchrow", "fetchval", "copy_records_to_table",
    "copy_to_table", "copy_from_table", "copy_from_query", "transaction",
})
POOL_METHODS = frozenset({"acquire", "release"})
ASYNCPG_FACTORIES = frozenset({"connect", "create_pool"})

_CAPITALS = [
    r"\bSELECT\b[\s\S]*?\bFROM\b",
    r"\bINSERT\s+INTO\b",
    r"\bUPDATE\s+[\w.\"{}]+\s+SET\b",
    r"\bDELETE\s+FROM\b",
    r"\b(?:CREATE|DROP|ALTER|TRUNCATE)\s+(?:OR\s+REPLACE\s+)?(?:TABLE|SCHEMA|INDEX|FUNCTION|"
    r"VIEW|DATABASE|SEQUENCE|TYPE)\b",
    r"\bON\s+CONFLICT\b",
]
_STATEMENT_START = r"""(?ix) ^\s* (?:
      select \s+ (?: \* | distinct\b | [\w.$]+ \s* (?: \( | , | \bfrom\b | $ ) )
    | insert \s+ into \s+ [\w."{}]+ \s* (?: \( | values\b | select\b | default\b )
    | update \s+ [\w."{}]+ \s+ set \s+ [\w"]+ \s* =
    | delete \s+ from \s+ [\w."{}]+ \s* (?: where\b | using\b | returning\b | ; | $ )
    | with \s+ \w+ \s+ as \s* \(
    | (?: create | drop | alter | truncate ) \s+ (?: or \s+ replace \s+ )?
      (?: table | schema | index | function | view | database ) \s+ [\w."{}]
)"""
"""A string that starts as a statement, in any case: the shape of SQL, not just its words
("select a queue from the list" is English: no column list)."""
_ADVISORY = r"(?i)\bpg_(?:try_)?advisory_\w*\s*\("
SQL_PATTERNS = [re.compile(p) for p in (*_CAPITALS, _STATEMENT_START, _ADVISORY)]


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` of a Name / Attribute chain ('' for anything else: a call, a subscript)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _joined_text(node: ast.JoinedStr) -> str:
    """An f-string's text with each replacement field as ``{}``."""
    return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str)
                   else "{}" for v in node.values)


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module) -> None:
        self.found: list[tuple[int, str]] = []
        self.imported: set[str] = set()      # names bound by an import
        self.asyncpg_aliases: set[str] = set()
        self.asyncpg_factories: set[str] = set()
        self.async_with_calls: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    self.imported.add(bound)
                    if alias.name == "asyncpg" or alias.name.startswith("asyncpg."):
                        self.asyncpg_aliases.add(bound)
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    bound = alias.asname or alias.name
                    self.imported.add(bound)
                    if (node.module or "").split(".")[0] == "asyncpg":
                        if alias.name in ASYNCPG_FACTORIES:
                            self.asyncpg_factories.add(bound)
                        elif alias.name in ("connection", "pool"):
                            self.asyncpg_aliases.add(bound)
            elif isinstance(node, ast.AsyncWith):
                self.async_with_calls.update(id(item.context_expr) for item in node.items
                                             if isinstance(item.context_expr, ast.Call))

    # -- calls -----------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = _dotted(func.value)
            root = _root(func.value)
            name = func.attr
            if root in self.asyncpg_aliases and name in ASYNCPG_FACTORIES:
                self.found.append((node.lineno, f"asyncpg call: {_dotted(func)}(...)"))
            elif receiver in self.imported:
                pass  # a module's function (reads.fetch, service.transaction)
            elif name in CONNECTION_METHODS:
                self.found.append((node.lineno, f"connection call: {receiver or '<expr>'}"
                                                f".{name}(...)"))
            elif name in POOL_METHODS and ("pool" in receiver.lower()
                                           or id(node) in self.async_with_calls):
                self.found.append((node.lineno, f"pool call: {receiver or '<expr>'}.{name}(...)"))
        elif isinstance(func, ast.Name) and func.id in self.asyncpg_factories:
            self.found.append((node.lineno, f"asyncpg call: {func.id}(...)"))
        self.generic_visit(node)

    # -- strings ---------------------------------------------------------------------------
    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, (ast.Constant, ast.JoinedStr)) and (
                isinstance(node.value, ast.JoinedStr) or isinstance(node.value.value, str)):
            return  # a docstring (or a string statement): documentation, never executed
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._check_text(node.lineno, _joined_text(node))
        for value in node.values:  # the replacement fields' own expressions
            if isinstance(value, ast.FormattedValue):
                self.visit(value.value)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self._check_text(node.lineno, node.value)

    def _check_text(self, line: int, text: str) -> None:
        for pattern in SQL_PATTERNS:
            m = pattern.search(text)
            if m:
                snippet = " ".join(text[m.start():m.end() + 20].split())[:60]
                self.found.append((line, f"SQL string: {snippet!r}"))
                return


def violations(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    checker = _Checker(tree)
    checker.visit(tree)
    return sorted(checker.found)


def scanned_files() -> list[Path]:
    return sorted(p for pkg in SCANNED for p in (ROOT / pkg).rglob("*.py")
                  if STORE not in p.parents)


def test_no_sql_or_connection_call_outside_the_store():
    files = scanned_files()
    assert len(files) > 60 and any(p.name == "leader_jobs.py" for p in files)  # the walk works
    found: dict[str, list[str]] = {}
    for path in files:
        hits = violations(path.read_text())
        if hits:
            found[str(path.relative_to(ROOT))] = [what for _line, what in hits]
    assert found == {}, "\n".join(
        f"{p}:{line}: {what}" for p in sorted(found)
        for line, what in violations((ROOT / p).read_text()))


# -- the rule can fail, and knows what is not a violation -----------------------------------

VIOLATING = '''
import asyncpg
import asyncpg as pg
from asyncpg import create_pool

async def job(store, conn, pool, x, self_pool):
    async with store.pool.acquire() as c:              # flags: pool call
        await c.fetchval(x)                            # flags: connection call
    await conn.execute(x)                              # flags: connection call
    await conn.fetch(x)                                # flags: connection call
    await conn.fetchrow(x)                             # flags: connection call
    await conn.executemany(x, [])                      # flags: connection call
    await conn.copy_records_to_table("t", records=[])  # flags: connection call
    async with conn.transaction():                     # flags: connection call
        pass
    c2 = await self_pool.acquire(timeout=1)            # flags: pool call
    await store.pool.release(c2)                       # flags: pool call
    async with c.acquire():                            # flags: pool call
        pass
    await asyncpg.connect("postgresql://")             # flags: asyncpg call
    await pg.create_pool("postgresql://")              # flags: asyncpg call
    await create_pool("postgresql://")                 # flags: asyncpg call
    q = "UPDATE queen.queues SET x = 1"                # flags: SQL string
    q = f"UPDATE {x} SET y = 1"                        # flags: SQL string
    q = f"DELETE FROM {x} WHERE true"                  # flags: SQL string
    q = "select version()"                             # flags: SQL string
    q = "SELECT pg_advisory_unlock($1)"                # flags: SQL string
    q = "insert into t values (1)"                     # flags: SQL string
    q = ("WITH v AS (SELECT 1) "                       # flags: SQL string
         "SELECT * FROM v")
    q = "DROP SCHEMA IF EXISTS s CASCADE"              # flags: SQL string
    q = "INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING"  # flags: SQL string
    q = "pg_try_advisory_xact_lock (737002)"           # flags: SQL string
'''

EXPECTED = {n: line.split("# flags: ")[1].strip()
            for n, line in enumerate(VIOLATING.splitlines(), start=1) if "# flags: " in line}


def test_the_rule_sees_each_kind_of_violation():
    """The check can fail: every line of a synthetic source that talks to PostgreSQL
    outside the store is found, with what it is."""
    hits = violations(VIOLATING)
    assert len(EXPECTED) == 24
    lines = {line for line, _ in hits}
    assert lines == set(EXPECTED), sorted(hits)
    for line, kind in EXPECTED.items():
        assert any(n == line and what.startswith(kind) for n, what in hits), (line, hits)
    # and a file with one of them fails the project-wide comparison
    assert violations("async def f(conn):\n    await conn.fetchval('SELECT 1')\n")


CLEAN = '''
"""A module that mentions SQL in its docstring: SELECT id FROM queen.queues, pg_advisory_lock(1)."""
import asyncio
from broker.store import reads
from broker.service import riders
from broker.http import service

class Thing:
    """DELETE FROM queen.messages is the retention's; INSERT INTO is the push's."""

    async def run(self, ctx, lock, loop, executor):
        "UPDATE x SET y: a string statement, documentation."
        await reads.fetch(ctx.store, [], [], [], [], 1, 1)   # a store module's function
        await service.transaction(ctx)                        # a service module's function
        await riders.prepare(ctx, None)
        lock.acquire()                                        # a file lock
        await asyncio.Lock().acquire()                        # an asyncio lock
        sem = asyncio.Semaphore(2)
        await sem.acquire()
        sem.release()
        await loop.run_in_executor(executor, print)
        executor.submit(print)
        self.fetch_all()
        logger.warning("Failed to create schema on target: {}", 1)
        logger.info("select a queue from the list, then delete from the dashboard")
        logger.info("Delete from the dashboard when done; insert into a queue first")
        logger.info("Update the settings, then create the table of figures")
        return f"update {ctx} soon; select one from these"  # English, lower case
'''


def test_what_the_rule_does_not_count():
    """Module functions named like connection methods, locks that are not pools, other
    names, docstrings and English are not violations."""
    assert violations(CLEAN) == []
