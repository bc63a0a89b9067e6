"""One module per route group, each a list ``OPERATIONS`` of ``builder.op`` entries. A new
route group adds a module here and one line to ``broker.http.openapi.GROUPS``."""
