"""/docs in a real browser: every method badge holds its whole label (the
navigation's hanging indent once pushed "POST" half out of its badge and cut "DELETE" to
"ELETE"), and the descriptions are drawn, not shown as raw Markdown."""
from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.timeout(120)

# For each badge: its label, its box, and the box of the label's text as laid out.
BADGES = """() => [...document.querySelectorAll('.m')].map(badge => {
    const range = document.createRange();
    range.selectNodeContents(badge);
    const text = range.getBoundingClientRect(), box = badge.getBoundingClientRect();
    return {label: badge.textContent, where: badge.closest('nav') ? 'nav' : 'main',
            boxLeft: box.left, boxRight: box.right, textLeft: text.left,
            textRight: text.right, scroll: badge.scrollWidth, client: badge.clientWidth};
})"""

# The page's visible text outside the schema sketches (<pre>), where no Markdown belongs.
PROSE = """() => {
    const copy = document.body.cloneNode(true);
    copy.querySelectorAll('pre').forEach(pre => pre.remove());
    document.body.append(copy);  // innerText needs a laid-out element
    copy.style.position = 'absolute';
    const text = copy.innerText;
    copy.remove();
    return text;
}"""


def test_method_badges_fit_and_descriptions_are_not_raw_markdown(dash, page):
    page.goto(dash.url + "/docs")
    page.wait_for_selector("section.op")
    badges = page.evaluate(BADGES)
    assert len(badges) > 100  # every operation, twice (navigation and body)
    assert {b["label"] for b in badges} <= {"GET", "POST", "PUT", "DELETE", "PATCH"}
    assert {"DELETE", "POST"} <= {b["label"] for b in badges}
    spilled = [b for b in badges
               if b["textLeft"] < b["boxLeft"] - 0.5 or b["textRight"] > b["boxRight"] + 0.5
               or b["scroll"] > b["client"]]
    assert not spilled, spilled[:5]
    # Each badge of the navigation is the same width, so the paths line up beside them.
    assert len({round(b["boxRight"] - b["boxLeft"]) for b in badges if b["where"] == "nav"}) == 1

    prose = page.evaluate(PROSE)
    assert "`" not in prose and "**" not in prose, [
        line for line in prose.splitlines() if "`" in line or "**" in line][:5]
    intro = page.locator("main .intro")
    assert intro.locator("p").count() >= 2  # paragraphs, not one preformatted block
    codes = intro.locator("code").all_inner_texts()
    assert "Retry-After" in codes and "JWT_ENABLED=true" in codes, codes
    assert page.locator("section.op p code").count() > 10  # operation descriptions too
    screenshot(page, "docs-page")
