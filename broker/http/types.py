"""The broker's Sanic types: the app, whose ``ctx`` is the :class:`HttpContext` (the
service layer's :class:`~broker.service.context.BrokerContext` plus what only the HTTP layer
uses), and its requests.

Annotate a handler's request as :data:`BrokerRequest` and ``request.app.ctx`` is the
typed context (with plain ``sanic.Request`` it is a ``SimpleNamespace``, where every
attribute is Any and nothing the handler does with it is checked).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TypeAlias

from sanic import Request, Sanic
from sanic.config import Config

from broker.http.auth import Authenticator
from broker.service.context import BrokerContext

__all__ = ["BrokerApp", "BrokerRequest", "HttpContext"]


@dataclass
class HttpContext(BrokerContext):
    """``app.ctx``: the services' context, and the JWT authenticator the request hook and
    the identity routes use (the services never see it)."""

    auth: Authenticator = field(kw_only=True)


BrokerApp: TypeAlias = Sanic[Config, HttpContext]
BrokerRequest: TypeAlias = Request[BrokerApp, SimpleNamespace]
