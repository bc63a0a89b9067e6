"""``/docs``: the OpenAPI document drawn as one self-contained HTML page (no script, no
stylesheet or font from elsewhere), so the reference works for a broker behind a firewall.

Descriptions are CommonMark in OpenAPI; the page draws the part of it they use (paragraphs,
`code`, **strong**) and escapes everything else as text, so no description can inject
markup. The project has no Markdown library, and this subset needs none."""
from __future__ import annotations

import re
from html import escape
from typing import Any

STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;display:flex}
nav{width:25rem;flex:none;height:100vh;overflow:auto;position:sticky;top:0;background:#f4f5f8;
padding:1rem;box-sizing:border-box;font-size:13px}
nav a{display:block;color:#1d2330;text-decoration:none;padding:1px 0 1px 5rem;
text-indent:-5rem;word-break:break-all}
nav h3{margin:1rem 0 .3rem;font-size:13px;text-transform:uppercase;color:#666}
main{padding:1rem 2rem;max-width:62rem}
section.op{border:1px solid #dde;border-radius:6px;margin:1rem 0;padding:.6rem 1rem}
.m{display:inline-block;box-sizing:border-box;min-width:4.5rem;font:bold 12px monospace;
color:#fff;border-radius:3px;padding:2px 6px;text-align:center;margin-right:.5rem;
text-indent:0;white-space:nowrap;word-break:normal}
nav .m{width:4.5rem}
.get{background:#2f7bd0}.post{background:#2d9a55}.delete{background:#c9473a}.put{background:#b07a12}
code,pre{font:13px ui-monospace,monospace}p code,td code{background:#f0f1f5;padding:0 3px;
border-radius:3px}pre{background:#f7f7fa;padding:.5rem;overflow:auto;
margin:.3rem 0}
table{border-collapse:collapse;margin:.3rem 0}td,th{border-bottom:1px solid #eee;padding:2px 8px;
text-align:left;vertical-align:top}
"""


_INLINE = re.compile(r"`([^`\n]+)`|\*\*([^*\n]+)\*\*")


def _inline(text: str) -> str:
    """One line of a description: `code` and **strong** drawn, the rest escaped."""
    out, at = [], 0
    for m in _INLINE.finditer(text):
        out.append(escape(text[at:m.start()]))
        out.append(f"<code>{escape(m[1])}</code>" if m[1] is not None
                   else f"<strong>{escape(m[2])}</strong>")
        at = m.end()
    out.append(escape(text[at:]))
    return "".join(out)


def markdown(text: str) -> str:
    """A description as HTML paragraphs (a blank line starts one; a line break inside one
    is a space), each drawn by ``_inline``."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n[ \t]*\n", text.strip())]
    return "".join(f"<p>{_inline(p)}</p>" for p in paragraphs if p)


def _schema(schema: Any, depth: int = 0) -> str:
    """A schema as a short, readable type sketch."""
    if not isinstance(schema, dict):
        return "any"
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " | ".join(_schema(s, depth) for s in schema["anyOf"])
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind else []
    suffix = " | null" if "null" in kinds else ""
    kinds = [k for k in kinds if k != "null"]
    if "enum" in schema:
        return " | ".join(repr(v) for v in schema["enum"]) + suffix
    if kinds == ["array"]:
        return f"[{_schema(schema.get('items'), depth)}]" + suffix
    if kinds == ["object"]:
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        if not props:
            return ("{string: " + _schema(extra, depth) + "}" if isinstance(extra, dict)
                    else "object") + suffix
        pad, required = "  " * (depth + 1), set(schema.get("required", ()))
        lines = [f"{pad}{name}{'' if name in required else '?'}: {_schema(sub, depth + 1)}"
                 for name, sub in props.items()]
        return "{\n" + "\n".join(lines) + "\n" + "  " * depth + "}" + suffix
    if not kinds:
        return "any"
    text = kinds[0]
    if schema.get("format"):
        text += f" ({schema['format']})"
    return text + suffix


def _operation(method: str, path: str, op: dict) -> str:
    anchor = escape(op["operationId"])
    out = [f'<section class="op" id="{anchor}"><h3><span class="m {method}">{method.upper()}'
           f'</span><code>{escape(path)}</code></h3><p>{_inline(op["summary"])}</p>']
    if op.get("description"):
        out.append(markdown(op["description"]))
    if op.get("security") == []:
        out.append("<p><em>Public: no token needed.</em></p>")
    params = op.get("parameters") or []
    if params:
        rows = "".join(
            f"<tr><td><code>{escape(p['name'])}</code></td><td>{p['in']}"
            f"{', required' if p.get('required') else ''}</td>"
            f"<td><code>{escape(_schema(p.get('schema')))}</code></td>"
            f"<td>{_inline(p.get('description', ''))}</td></tr>" for p in params)
        out.append(f"<h4>Parameters</h4><table>{rows}</table>")
    body = op.get("requestBody")
    if body:
        schema = body["content"]["application/json"]["schema"]
        out.append(f"<h4>Body (JSON{', required' if body.get('required') else ''})</h4>"
                   f"<pre>{escape(_schema(schema))}</pre>")
    out.append("<h4>Answers</h4><table>")
    for status, answer in op["responses"].items():
        sketch = "".join(f"<div><small>{escape(ct)}</small><pre>{escape(_schema(c.get('schema')))}"
                         f"</pre></div>" for ct, c in answer.get("content", {}).items())
        out.append(f"<tr><td><b>{status}</b></td><td>{_inline(answer['description'])}"
                   f"{sketch}</td></tr>")
    out.append("</table></section>")
    return "".join(out)


def render(doc: dict[str, Any]) -> str:
    by_tag: dict[str, list[tuple[str, str, dict]]] = {t["name"]: [] for t in doc["tags"]}
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            by_tag.setdefault(op["tags"][0], []).append((method, path, op))
    nav, main = [], []
    for tag, ops in by_tag.items():
        nav.append(f"<h3>{escape(tag)}</h3>")
        main.append(f"<h2>{escape(tag)}</h2>")
        for method, path, op in ops:
            nav.append(f'<a href="#{escape(op["operationId"])}"><span class="m {method}">'
                       f'{method.upper()}</span>{escape(path)}</a>')
            main.append(_operation(method, path, op))
    info = doc["info"]
    schemas = "".join(f"<h3 id=\"schema-{escape(name)}\">{escape(name)}</h3>"
                      f"<pre>{escape(_schema(s))}</pre>"
                      for name, s in doc["components"]["schemas"].items())
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width'>"
            f"<link rel=icon href=\"data:,\">"  # no /favicon.ico request (a 404)
            f"<title>{escape(info['title'])} {escape(info['version'])} API</title>"
            f"<style>{STYLE}</style></head><body><nav><b>{escape(info['title'])} "
            f"{escape(info['version'])}</b><br><a href=\"/openapi.json\">openapi.json</a>"
            f"{''.join(nav)}</nav><main><h1>{escape(info['title'])} HTTP API</h1>"
            f"<div class=\"intro\">{markdown(info['description'])}</div>{''.join(main)}"
            f"<h2>Shared schemas</h2>{schemas}</main></body></html>")
