"""The queue page's configuration form says, per option, whether this broker applies it, and
after a save shows what the configure answer applied and what it ignored (no
silent option)."""
from __future__ import annotations

import uuid

import httpx
import pytest

from tests.browser.conftest import screenshot
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def test_the_form_marks_each_option_and_shows_what_a_save_ignored(dash, page):
    q = f"opts-{uuid.uuid4().hex[:8]}"
    httpx.post(dash.url + "/api/v1/push", json={"items": [{"queue": q, "payload": 1}]},
               timeout=30).raise_for_status()
    page.goto(f"{dash.url}/#/queues/{q}")
    page.wait_for_selector("#config-form")
    supported = httpx.get(f"{dash.url}/api/v1/browse/queues/{q}").json()["supportedOptions"]
    for option in supported:
        assert page.locator(f"#opt-effect-{option['name']}").get_attribute("data-effect") \
            == option["effect"]
    assert "applied" in page.locator("#opt-effect-maxSize").inner_text()
    assert "stored only" in page.locator("#opt-effect-ttl").inner_text()

    # an applied option and one this broker does not act on, saved together
    page.locator("#opt-maxSize").fill("5")
    page.locator("#opt-priority").fill("3")
    page.locator("#config-save").click()
    page.wait_for_selector("#config-ignored")
    assert "maxSize" in page.locator("#config-applied").inner_text()
    ignored = page.locator("#config-ignored").inner_text()
    assert "priority" in ignored and "maxSize" not in ignored
    stored = httpx.get(f"{dash.url}/api/v1/browse/queues/{q}").json()["options"]
    assert (stored["maxSize"], stored["priority"]) == (5, 3)
    screenshot(page, "queue-config-ignored")

    # a save with nothing ignored clears the list
    page.locator("#opt-retryLimit").fill("4")
    page.locator("#config-save").click()
    wait_until(lambda: page.locator("#config-ignored").count() == 0
               and "retryLimit" in page.locator("#config-applied").inner_text(), 10,
               "the ignored list gone after a clean save")
