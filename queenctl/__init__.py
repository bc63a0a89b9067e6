"""queenctl: the operator's command line for a queen-broker, over its HTTP API.

    __main__.py  the entry point: one line on stderr and a documented exit code per failure
    client.py    the broker's HTTP API, one method per call; CtlError and the exit codes
    output.py    aligned tables for people, the broker's JSON (--json) for scripts
    commands.py  the commands: each one or two calls of the API
    operator.py  the operator groups: consumer groups, dead letters, messages, maintenance,
                 the quarantine, the spool holds, the background jobs
"""
