"""The docs site's hook (mkdocs.yml ``hooks:``) and the link check README.md shares with it.

The pages in docs/ link to files of the repository outside docs/ (compose/haproxy.cfg, the
Kubernetes manifests' README), by relative paths that climb out of docs/: such a link works
where the Markdown is read in the repository, but the site holds only docs/, so MkDocs would call it not found. Before a page is
converted, ``on_page_markdown`` checks each such link against the repository (the file must
exist inside it; a Markdown file's anchor must be one of its headings) and writes it as the
file's path in code, which the site can show. A link that does not resolve is a warning, and
``mkdocs build --strict`` fails on it. Links inside docs/ are MkDocs' own to check
(``validation:`` in mkdocs.yml).

``link_problems`` is the same check for any Markdown file of the repository, with GitHub's
anchors (the site's too: mkdocs.yml slugifies headings the same way);
tests/unit/test_links.py runs it over README.md.
"""
from __future__ import annotations

import logging
import os
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent
log = logging.getLogger("mkdocs.hooks.links")

# A Markdown link or image: [text](target) with an optional #anchor; no title, no spaces.
LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s#]*)(#[^)\s]*)?\)")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens (the
    one pymdownx.slugs.slugify(case="lower") makes, which mkdocs.yml sets for the site)."""
    text = re.sub(r"<[^>]*>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose(markdown: str) -> str:
    """The text outside fenced blocks (blanked, so line numbers hold)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)


@cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown file's headings, a repeated one numbered as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()).splitlines():
        if m := HEADING.match(line):
            s = slug(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2)))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return frozenset(out)


def _links(markdown: str):
    """(line number, match) of every link outside fenced blocks."""
    for n, line in enumerate(_prose(markdown).splitlines(), 1):
        for m in LINK.finditer(line):
            yield n, m


def target_problem(source: Path, target: str, anchor: str | None,
                   root: Path = ROOT) -> str | None:
    """Why a relative link from ``source`` does not resolve in the repository at ``root``, or
    None when it does."""
    path = (source.parent / target).resolve() if target else source
    if not path.is_relative_to(root.resolve()):
        return f"{target} leads out of the repository"
    if not path.exists():
        return f"{target} does not exist"
    if anchor and anchor != "#" and path.suffix == ".md" and anchor[1:] not in anchors(path):
        return f"{target or path.name} has no heading for {anchor}"
    return None


def link_problems(source: Path, root: Path = ROOT) -> list[str]:
    """Every relative link (and anchor) of a Markdown file that does not resolve."""
    found = []
    for n, m in _links(source.read_text()):
        target, anchor = m.group(3), m.group(4)
        if re.match(r"[a-z][\w+.-]*:", target):  # https:, mailto:
            continue
        if (problem := target_problem(source, target, anchor, root)) is not None:
            found.append(f"{source.name}:{n}: {problem}")
    return found


def outside_links(markdown: str, source: Path, docs_dir: Path) -> tuple[str, list[str]]:
    """The page with its links to files outside docs/ written as their repository paths, and
    what does not resolve among them."""
    problems: list[str] = []

    def rewrite(m: re.Match) -> str:
        image, text, target, anchor = m.groups()
        if not target or re.match(r"[a-z][\w+.-]*:", target):
            return m.group(0)
        path = (source.parent / target).resolve()
        if path.is_relative_to(docs_dir.resolve()):
            return m.group(0)  # MkDocs checks it
        if (problem := target_problem(source, target, anchor)) is not None:
            problems.append(problem)
            return m.group(0)
        shown = os.path.relpath(path, ROOT) + (anchor or "")
        if image or text.strip("`") in (shown, os.path.relpath(path, ROOT)):
            return f"`{shown}`"
        return f"{text} (`{shown}`)"

    parts, last = [], 0
    for fence in FENCE.finditer(markdown):
        parts.append(LINK.sub(rewrite, markdown[last:fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(parts), problems


def on_page_markdown(markdown, page, config, files):  # MkDocs calls it with these names
    source = Path(page.file.abs_src_path)
    text, problems = outside_links(markdown, source, Path(config["docs_dir"]))
    for problem in problems:
        log.warning("Doc file '%s': %s", page.file.src_uri, problem)
    return text
