"""The HTTP face: the only layer that knows Sanic.

    app.py          the Sanic app factory and composition root: actors, context, error mapping
    types.py        BrokerApp / BrokerRequest: request.app.ctx typed as the BrokerContext
    auth.py         JWT: tokens, algorithms, JWKS, per-route roles, producerSub
    responses.py    JSON in / JSON out helpers, CORS headers, LeanResponse
    compression.py  large answers zstd- or gzip-encoded when Accept-Encoding takes it
    forward.py      an ephemeral queue's request passed on to the broker that owns the queue
    wire/           Queen's wire format: parsing and answer shapes (its __init__ is the map)
    routes/         the routes: parse with wire, call a service, shape (its __init__ is the map)
    openapi/        the OpenAPI 3.1 document and the /docs page
    dashboard/      the web dashboard's static files (no Python)
"""
