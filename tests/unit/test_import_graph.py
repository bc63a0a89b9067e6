"""The house's walls, checked on the source:

* no import cycle among the modules of ``broker/`` and ``actors/``, counting
  imports inside functions (a lazy import hides a cycle, it does not remove it) and
  inside ``if TYPE_CHECKING:`` blocks (a type-only import is still a dependency a
  reader follows, and the type checker walks it);
* no route module imports another route module (shared work lives in
  ``broker/service/``);
* ``actors/``, ``broker/service/`` and ``broker/wiring.py`` never import Sanic;
* the layers: each module imports only modules of its own layer or of the layers
  below it, in this order, lowest first: ``broker.core`` (and the ``broker`` package itself,
  which holds only the version), ``broker.store``, ``actors``, ``broker.service``,
  ``broker.wiring`` (the composition root, one module), ``broker.http``, and
  ``broker.__main__`` on top.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "actors")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, known: set[str], this: str | None = None) -> set[str]:
    """Project modules imported anywhere in the file: at the top, inside functions and
    inside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    this = this or module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if (target := resolve(alias.name)) is not None:
                        found.add(target)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    target = resolve(f"{base}.{alias.name}") or resolve(base)
                    if target is not None:
                        found.add(target)
            visit(child)

    visit(tree)
    found.discard(this)
    return found


def full_graph() -> dict[str, set[str]]:
    """Every import edge of the project, the known exceptions included."""
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known) for p in files}


def project_graph() -> dict[str, set[str]]:
    """The graph the walls are checked on: every edge, type-only ones included."""
    return full_graph()


def test_the_graph_reads_type_checking_imports(tmp_path):
    """An import inside ``if TYPE_CHECKING:`` is an edge of the graph (so a type-only
    circle or back-edge is found)."""
    module = tmp_path / "probe.py"
    module.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from broker.http.auth import Authenticator\n")
    assert imports_of(module, {"broker.http.auth"}, "broker.service.probe") == {"broker.http.auth"}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return out


def test_the_import_graph_has_no_cycle():
    graph = project_graph()
    assert len(graph) > 40  # the walk found the project
    assert cycles(graph) == []


def route_modules() -> set[str]:
    """Modules under broker/http/routes that serve routes (they build a Blueprint);
    helpers beside them (routes/ops/common.py) and the packages that gather
    blueprints are not routes."""
    out = set()
    for path in (ROOT / "broker" / "http" / "routes").rglob("*.py"):
        if path.name != "__init__.py" and "Blueprint(" in path.read_text():
            out.add(module_name(path))
    return out


def test_no_route_imports_another_route():
    graph = project_graph()
    routes = route_modules()
    assert {"broker.http.routes.push", "broker.http.routes.pop", "broker.http.routes.ack"} <= routes
    assert {m: sorted(graph[m] & routes) for m in routes if graph[m] & routes} == {}


def test_actors_services_and_the_wiring_never_import_sanic():
    paths = [*(ROOT / "actors").rglob("*.py"), *(ROOT / "broker" / "service").rglob("*.py"),
             ROOT / "broker" / "wiring.py"]
    for path in paths:
        tree = ast.parse(path.read_text())
        names = {alias.name.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.Import) for alias in node.names}
        names |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom)}
        assert "sanic" not in names, path


def test_the_checker_sees_a_lazy_cycle(tmp_path):
    """The cycle test can fail: a lazy import that closes a loop is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


LAYERS = ("core", "store", "actors", "service", "wiring", "http", "main")


def layer_of(module: str) -> str:
    """The layer a project module belongs to (see the module docstring)."""
    if module == "broker":
        return "core"
    if module == "broker.__main__":
        return "main"
    if module == "actors" or module.startswith("actors."):
        return "actors"
    folder = module.split(".")[1]
    assert folder in LAYERS, f"{module} is in no layer: put it in one of broker/{LAYERS}"
    return folder


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if LAYERS.index(layer_of(d)) > LAYERS.index(layer_of(m)))


def test_each_layer_imports_only_the_layers_below_it():
    graph = project_graph()
    assert {layer_of(m) for m in graph} == set(LAYERS)  # every layer has modules
    assert upward_imports(graph) == []


def test_the_layer_check_sees_an_upward_import():
    """The layer test can fail: the store importing a route is found, and so is an actor
    importing a service."""
    graph = {"broker.store.db": {"broker.http.routes.push"}, "actors.spool": {"broker.service.push"},
             "broker.http.app": {"actors.spool", "broker.core.config"}}
    assert upward_imports(graph) == ["actors.spool -> broker.service.push",
                                     "broker.store.db -> broker.http.routes.push"]
