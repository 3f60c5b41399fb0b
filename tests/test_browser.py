"""The report and the live app in a real browser: headless Chromium (Debian's
chromium and chromium-driver packages; .ci/run installs them) driven by
Selenium. Each view renders with its traces, a filter changes a figure, a
hostile axis value runs no script, and screenshots are saved (to
$ARCHSEARCH_SCREENSHOTS when set, else the test's tmp folder). Skipped when
Chromium or its driver is absent."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from archsearch_dashboards.app import SEARCH_VIEWS, VIEWS, create_app
from archsearch_dashboards.report import write_report

import archsearch as A
from tests.dashboard_support import HOSTILE, write_store

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)),
                       reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)"),
]

# Per view: traces in the figure's data, and the SVG or canvas elements that show they were drawn.
DRAWN = """
const out = {};
for (const name of arguments[0]) {
  const root = document.getElementById('view-' + name);
  const g = root && (root.classList.contains('js-plotly-plot') ? root : root.querySelector('.js-plotly-plot'));
  out[name] = g && g._fullData ? {traces: g.data.length,
    drawn: g.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .parcoords .y-axis').length} : null;
}
return out;
"""


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("browser") / "s.duckdb"
    write_store(path, shapes=(HOSTILE, "cosine", "reverse"))
    return path


def screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ARCHSEARCH_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def wait_for(browser, predicate, timeout: float = 30.0):
    """``predicate()``'s first truthy value, polling; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"gave up after {timeout:.0f}s waiting in the browser (last: {predicate()!r})")


def assert_no_alert(browser):
    """The hostile axis value's onerror=alert(1) never ran."""
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018  (the lookup is the check)


# the views of a grid's study (the search views are a sampled study's; tests/test_search_views.py)
GRID_VIEWS = [name for name in VIEWS if name not in SEARCH_VIEWS]


def drawn(browser) -> dict:
    return browser.execute_script(DRAWN, GRID_VIEWS)


def test_the_report_renders_every_view_offline_and_its_legend_toggles(browser, store, tmp_path):
    """Opened from a file (no server), every view holds traces and drew them;
    clicking the first arm in the scaling legend hides that arm."""
    with A.open_store(store, read_only=True) as db:
        page = write_report(db, tmp_path / "report.html")
    browser.get(page.as_uri())
    views = wait_for(browser, lambda: (lambda v: v if all(x and x["drawn"] for x in v.values()) else None)(
        drawn(browser)))
    assert all(views[name]["traces"] > 0 for name in GRID_VIEWS), views
    assert_no_alert(browser)
    browser.save_screenshot(str(screenshots(tmp_path) / "report.png"))
    legend = browser.find_elements("css selector", "#view-scaling .legend .traces")
    legend[0].click()
    hidden = wait_for(browser, lambda: browser.execute_script(
        "return document.getElementById('view-scaling').data.filter(t => t.visible === 'legendonly').length"))
    assert hidden >= 1


@pytest.fixture
def live(store):
    """The app served on a free loopback port for one test."""
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", 0, create_app(store).server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    thread.join(timeout=10)


def test_the_live_app_renders_every_view_and_a_family_filter_changes_the_curves(browser, live, tmp_path):
    """All 15 curves at first; choosing the hybrid family leaves its 6, and the summary says so."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(live)
    views = wait_for(browser, lambda: (lambda v: v if all(x and x["drawn"] for x in v.values()) else None)(
        drawn(browser)))
    assert views["curves"]["traces"] == 15, views
    assert_no_alert(browser)
    browser.save_screenshot(str(screenshots(tmp_path) / "app.png"))

    browser.find_element(By.ID, "families").click()
    option = wait_for(browser, lambda: next((o for o in browser.find_elements(By.CSS_SELECTOR, "[role=option]")
                                             if o.text.strip() == "hybrid"), None))
    option.click()
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    wait_for(browser, lambda: drawn(browser)["curves"]["traces"] == 6)
    assert browser.find_element(By.ID, "summary").text.startswith("6 of 15")
    browser.save_screenshot(str(screenshots(tmp_path) / "app-hybrid.png"))
