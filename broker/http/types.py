"""The broker's Sanic types: the app, whose ``ctx`` is the
:class:`~broker.service.context.BrokerContext`, and its requests.

Annotate a handler's request as :data:`BrokerRequest` and ``request.app.ctx`` is the
typed context (with plain ``sanic.Request`` it is a ``SimpleNamespace``, where every
attribute is Any and nothing the handler does with it is checked).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import TypeAlias

from sanic import Request, Sanic
from sanic.config import Config

from broker.service.context import BrokerContext

__all__ = ["BrokerApp", "BrokerRequest"]

BrokerApp: TypeAlias = Sanic[Config, BrokerContext]
BrokerRequest: TypeAlias = Request[BrokerApp, SimpleNamespace]
