"""Operator routes: resources, consumer groups, messages, traces, status,
analytics and metrics (api.md §10–§15). Each module adds its blueprint here."""
from __future__ import annotations

blueprints: list = []
