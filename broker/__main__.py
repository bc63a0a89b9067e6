"""``python -m broker`` / ``queen-broker``: configuration -> database -> HTTP.

With PG_HOST unset the broker starts (and at exit stops) its own embedded
PostgreSQL, with its data in EMBEDDED_PG_DIR so it survives restarts.
"""
from __future__ import annotations

import sys
from urllib.parse import quote

from loguru import logger

from broker.config import ConfigError, Settings, load_settings


def external_dsn(settings: Settings) -> str:
    user = quote(settings.pg_user, safe="")
    password = quote(settings.pg_password, safe="")
    ssl = ""
    if settings.pg_use_ssl:
        ssl = "?sslmode=" + ("require" if settings.pg_ssl_reject_unauthorized else "prefer")
    return (f"postgresql://{user}:{password}@{settings.pg_host}:{settings.pg_port}/"
            f"{quote(settings.pg_db, safe='')}{ssl}")


def setup_logging(level: str) -> None:
    logger.remove()
    logger.add(sys.stderr, level=level,
               format="<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> <level>{level: <7}</level> "
                      "{message}")


def main() -> int:
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"queen-broker: configuration error: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    for block, values in settings.log_blocks().items():
        logger.info("{}: {}", block, " ".join(f"{k}={v}" for k, v in values.items()))

    embedded = None
    if settings.embedded_pg:
        from broker.embedded_pg import EmbeddedPostgres
        embedded = EmbeddedPostgres(settings.embedded_pg_dir, port=settings.embedded_pg_port)
        logger.info("starting embedded PostgreSQL in {}", settings.embedded_pg_dir)
        embedded.start()
        dsn = embedded.dsn
        logger.info("embedded PostgreSQL ready on {}:{}", embedded.host, embedded.port)
    else:
        dsn = external_dsn(settings)

    from broker.app import create_app
    try:
        app = create_app(settings, dsn)
    except ConfigError as exc:  # e.g. unreadable JWT key material
        logger.error("configuration error: {}", exc)
        if embedded is not None:
            embedded.stop()
        return 2
    try:
        # One process, one event loop: the actors live beside the handlers.
        app.run(host=settings.host, port=settings.port, single_process=True,
                access_log=False, motd=False)
    finally:
        if embedded is not None:
            logger.info("stopping embedded PostgreSQL")
            embedded.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
