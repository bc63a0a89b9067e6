"""The leaves every layer may use; nothing here imports the project above it:

    config.py          every environment variable: parsed, validated, documented once
    config_parsers.py  the parsers config.py's variables use, and ConfigError
    logs.py            one log format for every line (text or JSON), Throttle
    telemetry.py       the process's counters, rate meters and latency histograms
    validate.py        the acceptance rule: what PostgreSQL will store, checked before answering
    crypto.py          the AES-256-GCM payload envelope
    errors.py          BadRequest: a caller's mistake, answered 400
    ids.py             uuid7 ids and the uuid check
    loop_lag.py        LoopMonitor: the event loop's lag, behind /health/live
    times.py           ISO-8601 spellings and the timestamp parse
    domain.py          the value types several layers share (PushItem, PopRequest, AckRow)
"""
