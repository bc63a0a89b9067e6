"""The HTTP face: the Sanic app, authentication, routes, the OpenAPI document, the dashboard's
files, and wire/ (request parsing and response shaping)."""
