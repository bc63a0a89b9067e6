"""Queen-compatible message broker on PostgreSQL. The folders are the layers, lowest first
(ARCHITECTURE.md is the whole map):

    core/        the leaves every layer may use: configuration, logs, telemetry, ids, times
    store/       the only code that speaks SQL: the pool, the statements, the migrations
    service/     what the broker does (push, pop, ack, the state surfaces), Sanic-free
    wiring.py    the composition root: starts the store and the actors and hands them to
                 the services, one function per subsystem (called by http/app.py)
    http/        the HTTP face: the Sanic app, routes, wire format, OpenAPI, dashboard
    __main__.py  ``python -m broker`` / ``queen-broker``: config, socket, spool lock, database, app

This module itself holds only the version.
"""
__version__ = "0.2.0"
