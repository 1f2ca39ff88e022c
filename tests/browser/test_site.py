"""The documentation site in a real browser: built strictly into a temporary folder, served on 127.0.0.1, then
the findings gallery's index and one finding's page are opened in chromium, every figure on them is an
image that decoded (naturalWidth > 0: no broken image), and the search box finds a finding by its name.
Screenshots go to tests/browser/screenshots/ (git-ignored).

Needs Debian's chromium, Playwright for Python (`make test-browser` installs both; Playwright never
downloads a browser here) and MkDocs (the docs extra). Skips with the reason otherwise. About 30 s.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FINDING = "keskar"        # the page opened, and the name typed into the search box

pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (`make test-browser` installs it)")
pytest.importorskip("mkdocs", reason="MkDocs is not installed (the docs extra, which `make install` installs)")
if not Path(CHROMIUM).exists():
    pytest.skip("chromium not found (as root: apt-get install chromium; `make test-browser` does it)",
                allow_module_level=True)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built strictly and served over HTTP on 127.0.0.1 (the search index is fetched, which a
    file:// page cannot do). Yields its address."""
    folder = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def figures_decoded(page) -> tuple[int, list[str]]:
    """How many figures the page's content has, and the sources of those that did not decode."""
    page.wait_for_load_state("load")
    return page.evaluate("""() => {
        const images = [...document.querySelectorAll('article img')];
        return [images.length, images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)];
    }""")


def test_the_gallery_and_a_finding_show_their_figures_and_search_finds_the_finding(site):
    from playwright.sync_api import sync_playwright
    SCREENSHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            for path, name in ((f"{site}/findings/", "site_gallery"), (f"{site}/findings/{FINDING}/", "site_finding")):
                assert page.goto(path).ok, path
                count, broken = figures_decoded(page)
                assert count >= 1, f"{path}: no figure"
                assert not broken, f"{path}: images that did not decode: {broken}"
                page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

            page.locator("input.md-search__input").click()
            page.keyboard.type(FINDING)        # as a user types it
            result = page.locator(f'.md-search-result__link[href*="findings/{FINDING}/"]').first
            result.wait_for(timeout=30_000)
            page.screenshot(path=str(SCREENSHOTS / "site_search.png"))
            result.click()
            page.wait_for_url(f"**/findings/{FINDING}/**")
            assert FINDING in page.locator("article h1").inner_text()
        finally:
            browser.close()
