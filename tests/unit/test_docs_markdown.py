"""The /docs page's Markdown: the subset the descriptions use is drawn, anything
else stays text, and nothing in a description becomes markup."""
from __future__ import annotations

from broker.http.openapi.page import markdown


def test_paragraphs_code_and_strong():
    assert markdown("One line\nwrapped.\n\nA `code` and **strong** word.") == (
        "<p>One line wrapped.</p><p>A <code>code</code> and <strong>strong</strong> word.</p>")


def test_everything_is_escaped_in_and_out_of_code():
    html = markdown('<script>x</script> `<b>"&"</b>` **<i>**')
    assert "<script>" not in html and "<b>" not in html and "<i>" not in html
    assert "&lt;script&gt;" in html and "<code>&lt;b&gt;&quot;&amp;&quot;&lt;/b&gt;</code>" in html
    assert "<strong>&lt;i&gt;</strong>" in html


def test_a_lone_marker_stays_text():
    assert markdown("If-None-Match: * and a ` alone") == (
        "<p>If-None-Match: * and a ` alone</p>")
