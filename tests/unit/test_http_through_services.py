"""broker/http reaches the broker through broker/service only: routes parse and shape,
services do the work. No module of broker/http imports broker.store or actors, counting
imports inside functions and under ``if TYPE_CHECKING:``, except the composition root
(broker/http/app.py, and broker/wiring.py or broker/http/wiring.py where the actors and
the store are built and handed to the services)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSITION_ROOT = {"broker/http/app.py", "broker/http/wiring.py", "broker/wiring.py"}
BELOW_THE_SERVICES = ("broker.store", "actors")


def imported_modules(source: str) -> set[str]:
    """Every module named by an import anywhere in ``source`` (absolute imports; the
    project uses no relative ones), TYPE_CHECKING blocks and function bodies included.
    ``from a import b`` counts as both ``a`` and ``a.b``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def reaches_below(source: str) -> list[str]:
    return sorted(m for m in imported_modules(source)
                  if any(m == low or m.startswith(low + ".") for low in BELOW_THE_SERVICES))


def test_no_http_module_outside_the_composition_root_imports_the_store_or_actors():
    paths = [p for p in (ROOT / "broker" / "http").rglob("*.py")
             if str(p.relative_to(ROOT)) not in COMPOSITION_ROOT]
    assert len(paths) > 40  # the walk found broker/http
    found = {str(p.relative_to(ROOT)): reaches_below(p.read_text()) for p in paths}
    assert {path: modules for path, modules in found.items() if modules} == {}


def test_the_check_sees_a_type_only_or_lazy_import_of_the_store_or_an_actor():
    source = '''
from typing import TYPE_CHECKING
from broker.service import push
if TYPE_CHECKING:
    from actors.hotlist import SizedTake
def handler():
    import broker.store.ops
from broker import store
'''
    assert reaches_below(source) == ["actors.hotlist", "actors.hotlist.SizedTake",
                                     "broker.store", "broker.store.ops"]
    assert reaches_below("from broker.service.kv import KvOp\nimport actorsx\n") == []
