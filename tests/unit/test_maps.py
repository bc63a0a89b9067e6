"""The maps check themselves: every Python module of ``broker/``, ``actors/`` and ``queenctl/``
is named in ARCHITECTURE.md and in its package's map (the ``__init__.py`` docstring), and
neither map names a module that is not there.

How a map names a module:

* ARCHITECTURE.md's map (the first code block, under "Rooms") is cut into blocks at each line
  that starts in the first column (``broker/store/``, ``actors/``, ``broker/__main__.py``, ...).
  A module is named in the block whose heading is the longest folder holding it, by its path
  relative to that folder or any tail of it (``live.py``, ``ops/live.py``,
  ``routes/ops/live.py``), as long as that tail names no other module of the block: where two
  modules share a file name (``routes/kv.py``, ``wire/kv.py``) each is written with its folder.
* A package's docstring names each module of the package by its file name (``records.py``)
  and each subpackage by its folder name (``spool/``), not preceded by ``/`` or ``.``.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "actors", "queenctl")
TOP_FOLDERS = ("broker/", "actors/", "queenctl/", "tests/", "benchmarks/", "compose/", "docs/")
# A file name ending in .py, with or without folders, standing alone (not inside a longer path
# such as a dotted module name or a URL).
PY_TOKEN = re.compile(r"(?<![\w/.\-])((?:[\w\-]+/)*[\w\-]+\.py)(?![\w/])")


def modules() -> list[str]:
    """Every module file (``__init__.py`` aside: a package is named by its folder) as a path
    relative to the repository, sorted."""
    return sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def packages() -> list[Path]:
    return sorted(p.parent for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")
                  if "__pycache__" not in p.parts)


# -- ARCHITECTURE.md ------------------------------------------------------------------------

def architecture_blocks(text: str) -> dict[str, str]:
    """The map's blocks: heading (``broker/store/``) -> the block's text, heading line
    included."""
    body = text.split("```", 2)[1]
    blocks: dict[str, list[str]] = {}
    heading = None
    for line in body.splitlines():
        if line and not line[0].isspace():
            heading = line.split()[0]
            blocks[heading] = []
        if heading is not None:
            blocks[heading].append(line)
    return {h: "\n".join(lines) for h, lines in blocks.items()}


def block_of(module: str, headings: list[str]) -> str | None:
    """The heading of the block a module belongs in: the longest folder heading holding it, or
    the module itself when it is a heading (``broker/__main__.py``)."""
    if module in headings:
        return module
    holding = [h for h in headings if h.endswith("/") and module.startswith(h)]
    return max(holding, key=len) if holding else None


def names_in(text: str) -> set[str]:
    return set(PY_TOKEN.findall(text))


def architecture_problems(text: str, all_modules: list[str]) -> list[str]:
    blocks = architecture_blocks(text)
    headings = list(blocks)
    problems = []
    members: dict[str, list[str]] = {}
    for module in all_modules:
        heading = block_of(module, headings)
        if heading is None:
            problems.append(f"{module}: ARCHITECTURE.md's map has no block for its folder: start "
                            f"one with a line `{module.split('/')[0]}/   what it holds`")
            continue
        members.setdefault(heading, []).append(module)
    for heading, mods in members.items():
        tokens = names_in(blocks[heading])
        relative = {m: m[len(heading):] if heading.endswith("/") else m for m in mods}

        def named_by(token: str, rel: dict[str, str] = relative) -> list[str]:
            return [m for m, r in rel.items() if r == token or r.endswith("/" + token)]

        for module in mods:
            if module == heading:
                continue
            hits = [t for t in tokens if module in named_by(t)]
            if not any(len(named_by(t)) == 1 for t in hits):
                rel = relative[module]
                if hits:
                    problems.append(
                        f"{module}: ARCHITECTURE.md names it only as `{sorted(hits)[0]}`, which "
                        f"in the `{heading}` block also names "
                        f"{', '.join(m for m in named_by(sorted(hits)[0]) if m != module)}: "
                        f"write `{rel}`")
                else:
                    short = rel.rsplit("/", 1)[-1]
                    spelled = f"`{short}`" + (f" (or `{rel}`)" if rel != short else "")
                    problems.append(f"{module}: not named in ARCHITECTURE.md: write {spelled} "
                                    f"in the `{heading}` block of the map, saying what it does")
        for token in sorted(tokens):
            if token.startswith(TOP_FOLDERS) or "/" not in token and (ROOT / token).is_file():
                if not (ROOT / token).is_file():
                    problems.append(f"ARCHITECTURE.md's `{heading}` block names {token}, "
                                    f"which does not exist")
            elif not named_by(token):
                problems.append(f"ARCHITECTURE.md's `{heading}` block names `{token}`, which is "
                                f"no module under {heading}: remove it or correct it")
    return problems


def test_every_module_is_named_in_architecture_md():
    all_modules = modules()
    assert len(all_modules) > 150  # the walk found the project
    problems = architecture_problems((ROOT / "ARCHITECTURE.md").read_text(), all_modules)
    assert not problems, "\n".join(problems)


def test_every_document_is_named_in_architecture_md():
    block = architecture_blocks((ROOT / "ARCHITECTURE.md").read_text())["docs/"]
    missing = [f"docs/{doc.name}: not named in ARCHITECTURE.md: write `{doc.name}` in the "
               f"`docs/` block of the map, saying what it holds"
               for doc in sorted((ROOT / "docs").glob("*.md"))
               if not re.search(rf"(?<![\w/.\-]){re.escape(doc.name)}\b", block)]
    assert not missing, "\n".join(missing)


# -- the packages' docstring maps -----------------------------------------------------------

def bare_names(docstring: str) -> set[str]:
    """File names (``x.py``) and folder names (``x/``) the docstring writes on their own."""
    files = set(re.findall(r"(?<![\w/.\-])([\w\-]+\.py)(?![\w/])", docstring))
    folders = set(re.findall(r"(?<![\w/.\-])([\w\-]+)/(?![\w.\-])", docstring))
    return files | {f"{name}/" for name in folders}


def docstring_problems(package: Path, docstring: str) -> list[str]:
    where = f"{package.relative_to(ROOT)}/__init__.py"
    contents = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    contents |= {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    written = bare_names(docstring)
    problems = [f"{package.relative_to(ROOT)}/{name}: not named in {where}'s docstring map: "
                f"add a line `{name}   what it does`" for name in sorted(contents - written)]
    problems += [f"{where}'s docstring map names `{name}`, which is not in "
                 f"{package.relative_to(ROOT)}/" for name in sorted(written - contents)
                 if name.endswith(".py")]
    return problems


def test_every_module_is_named_in_its_package_docstring():
    problems = []
    for package in packages():
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        problems += docstring_problems(package, docstring)
    assert not problems, "\n".join(problems)


# -- the checks can fail --------------------------------------------------------------------

MAP = """# map

```
broker/store/      the store
  db.py            the pool
  routes/kv.py, wire/kv.py   two of a name
broker/__main__.py the entry
```
"""


def test_the_architecture_check_sees_a_module_left_out_an_ambiguous_name_and_a_stale_one():
    mods = ["broker/__main__.py", "broker/store/db.py", "broker/store/health.py",
            "broker/store/routes/kv.py", "broker/store/wire/kv.py", "actors/hints.py"]
    assert architecture_problems(MAP, mods) == [
        "actors/hints.py: ARCHITECTURE.md's map has no block for its folder: start one with a "
        "line `actors/   what it holds`",
        "broker/store/health.py: not named in ARCHITECTURE.md: write `health.py` in the "
        "`broker/store/` block of the map, saying what it does",
    ]
    ambiguous = MAP.replace("routes/kv.py, wire/kv.py", "kv.py")
    assert architecture_problems(ambiguous, mods[:2] + mods[3:5]) == [
        "broker/store/routes/kv.py: ARCHITECTURE.md names it only as `kv.py`, which in the "
        "`broker/store/` block also names broker/store/wire/kv.py: write `routes/kv.py`",
        "broker/store/wire/kv.py: ARCHITECTURE.md names it only as `kv.py`, which in the "
        "`broker/store/` block also names broker/store/routes/kv.py: write `wire/kv.py`",
    ]
    assert architecture_problems(MAP, ["broker/__main__.py", "broker/store/routes/kv.py",
                                       "broker/store/wire/kv.py"]) == [
        "ARCHITECTURE.md's `broker/store/` block names `db.py`, which is no module under "
        "broker/store/: remove it or correct it"]


def test_the_docstring_check_sees_a_module_left_out_and_a_stale_one(tmp_path):
    package = ROOT / "actors" / "spool"
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert docstring_problems(package, docstring) == []
    left_out = docstring.replace("records.py", "records")
    assert docstring_problems(package, left_out) == [
        "actors/spool/records.py: not named in actors/spool/__init__.py's docstring map: add a "
        "line `records.py   what it does`"]
    assert docstring_problems(package, docstring + "\n    gone.py   a module since removed") == [
        "actors/spool/__init__.py's docstring map names `gone.py`, which is not in actors/spool/"]
