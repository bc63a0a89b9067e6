"""Small constructors for OpenAPI 3.1 entries, so that describing a route is a few lines.

An entry is ``op(method, path, ...)``: a path in Sanic's spelling is turned into OpenAPI's
(``<queue:str>`` -> ``{queue}``), every route gets the answers every route can give (401/403
under JWT, 503 with Retry-After when the database is unreachable) unless told otherwise, and
a route with parameters or a body gets its 400. The schemas say what the broker answers, no
more: objects list the fields a client can count on and leave the rest open.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

Schema = dict[str, Any]

# -- schemas ----------------------------------------------------------------


def obj(properties: dict[str, Schema] | None = None, required: list[str] | tuple = (),
        **extra: Any) -> Schema:
    """An object with these typed fields; ``required`` ones are always present."""
    out: Schema = {"type": "object"}
    if properties:
        out["properties"] = properties
    if required:
        out["required"] = list(required)
    out.update(extra)
    return out


def arr(items: Schema, **extra: Any) -> Schema:
    return {"type": "array", "items": items, **extra}


def nullable(schema: Schema) -> Schema:
    """``schema`` or null (OpenAPI 3.1 spells it as a type list)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
ANY: Schema = {}
UUID: Schema = {"type": "string", "format": "uuid"}
TIME: Schema = {"type": "string", "description": "ISO-8601 UTC timestamp"}
NTIME = nullable(TIME)
NSTR = nullable(STR)
NINT = nullable(INT)
MAP: Schema = {"type": "object"}

ERROR: Schema = obj({"error": STR}, ["error"])


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


# -- parameters -------------------------------------------------------------


def path(name: str, description: str = "", schema: Schema | None = None) -> dict:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": schema or {"type": "string", "minLength": 1}}


def query(name: str, description: str = "", schema: Schema | None = None,
          required: bool = False) -> dict:
    return {"name": name, "in": "query", "required": required, "description": description,
            "schema": schema or STR}


def q_int(name: str, description: str, default: int | None = None) -> dict:
    """An integer query parameter. The broker clamps values past its bounds rather than
    refusing them, so the schema bounds nothing but the type."""
    schema: Schema = {"type": "integer"}
    if default is not None:
        schema["default"] = default
    return query(name, description, schema)


def q_bool(name: str, description: str) -> dict:
    return query(name, description + " (true/false, 1/0)",
                 {"type": "string", "enum": ["true", "false", "1", "0"]})


FROM = query("from", "Start of the time range (ISO-8601); default: one range back from `to`",
             {"type": "string", "format": "date-time"})
TO = query("to", "End of the time range (ISO-8601); default: now", {"type": "string",
                                                                  "format": "date-time"})
LIMIT_OFFSET = (q_int("limit", "Page size"), q_int("offset", "Rows to skip", 0))

# -- answers ----------------------------------------------------------------

RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying",
                               "schema": {"type": "string"}}}

ERRORS = {
    400: "Bad input: nothing was changed",
    401: "JWT_ENABLED and no valid bearer token",
    403: "JWT_ENABLED and the token's role is too low for this route",
    404: "Not found",
    409: "Conflict",
    413: "Body over MAX_BODY_BYTES, or too many items for one request",
    503: "Database unreachable or busy (or the spool full): retry after Retry-After",
}


def error(status: int, description: str | None = None) -> dict:
    answer: dict[str, Any] = {"description": description or ERRORS[status],
                              "content": {"application/json": {"schema": ref("Error")}}}
    if status == 503:
        answer["headers"] = RETRY_AFTER
    return answer


def answer(schema: Schema, description: str = "OK", content_type: str = "application/json"
           ) -> dict:
    return {"description": description, "content": {content_type: {"schema": schema}}}


# -- operations -------------------------------------------------------------


def openapi_path(sanic_path: str) -> str:
    """``/a/<x:str>/<y>`` -> ``/a/{x}/{y}``."""
    return re.sub(r"<([^:>]+)(:[^>]*)?>", r"{\1}", sanic_path)


@dataclass
class Op:
    method: str
    path: str          # OpenAPI spelling
    operation: dict = field(default_factory=dict)


def op(method: str, route: str, *, tag: str, summary: str, description: str = "",
       params: tuple | list = (), body: Schema | None = None, body_required: bool = False,
       ok: Schema | None = None, ok_status: int = 200, ok_description: str = "OK",
       responses: dict[int, dict] | None = None, errors: tuple[int, ...] = (),
       public: bool = False, database: bool = True, operation_id: str | None = None) -> Op:
    """One operation. ``errors`` adds documented error statuses (400 is added for any route
    with parameters or a body); ``public`` routes answer without a token; ``database`` routes
    can answer 503 when PostgreSQL is unreachable."""
    path_ = openapi_path(route)
    out_responses: dict[str, Any] = {}
    if ok is not None:
        out_responses[str(ok_status)] = answer(ok, ok_description)
    for status, value in (responses or {}).items():
        out_responses[str(status)] = value
    codes = set(errors)
    if params or body is not None:
        codes.add(400)
    if body is not None:
        codes.add(413)
    if not public:
        codes |= {401, 403}
    if database:
        codes.add(503)
    for status in sorted(codes):
        out_responses.setdefault(str(status), error(status))
    operation: dict[str, Any] = {
        "tags": [tag], "summary": summary,
        "operationId": operation_id or _operation_id(method, path_),
        "responses": out_responses,
    }
    if description:
        operation["description"] = description
    if params:
        operation["parameters"] = list(params)
    if body is not None:
        operation["requestBody"] = {"required": body_required,
                                    "content": {"application/json": {"schema": body}}}
    if public:
        operation["security"] = []
    return Op(method.lower(), path_, operation)


def _operation_id(method: str, path_: str) -> str:
    words = re.findall(r"[A-Za-z0-9]+", path_.replace("/api/v1", ""))
    return method.lower() + "".join(w[:1].upper() + w[1:] for w in words)
