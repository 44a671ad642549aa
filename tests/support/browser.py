"""A real headless Chromium driven by Playwright, for tests that click through the Dagster UI.

The browser is Debian's ``chromium`` package (``make setup`` / ``.ci/run`` install it; Playwright
downloads nothing): Playwright's Python package only drives it over the DevTools protocol.
Screenshots go to :data:`ARTIFACTS` (``test-artifacts/screenshots/``, kept by CI), named by test.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from pipelines.settings import PROJECT_ROOT

ARTIFACTS = Path(os.environ.get("CONFLUX_TEST_ARTIFACTS", PROJECT_ROOT / "test-artifacts"))
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str:
    """Debian's Chromium (or ``$CONFLUX_CHROMIUM``); fails naming the fix when it is missing."""
    configured = os.environ.get("CONFLUX_CHROMIUM")
    found = configured or next(filter(None, map(shutil.which, CHROMIUM_CANDIDATES)), None)
    if not found:
        raise AssertionError(
            "no Chromium on this machine: run `make setup` (installs Debian's chromium package) "
            "or set CONFLUX_CHROMIUM to a Chromium binary"
        )
    return found


@dataclass
class Browser:
    """A page of the UI at ``base_url``, and where its screenshots go."""

    page: Page
    base_url: str
    shots: Path

    def open(self, path: str) -> None:
        self.page.goto(self.base_url + path, wait_until="networkidle")
        self.dismiss_welcome()

    def dismiss_welcome(self) -> None:
        """The first visit to a new Dagster instance shows a community dialog: skip it.

        The UI shows it only while the instance answers ``shouldShowNux`` (its Skip sets that
        to false on the server), so the page is asked the same first: once it was skipped, no
        page of any browser waits for a dialog that will not come (3 s an open before)."""
        if not self.nux_pending():
            return
        skip = self.page.get_by_role("button", name="Skip", exact=True)
        try:
            skip.wait_for(state="visible", timeout=10_000)
        except PlaywrightTimeoutError:  # not shown after all (e.g. skipped meanwhile)
            return
        skip.click()

    def nux_pending(self) -> bool:
        """Whether the instance would still show the community dialog (the UI's own query)."""
        reply = requests.post(
            f"{self.base_url}/graphql", json={"query": "{ shouldShowNux }"}, timeout=30
        )
        reply.raise_for_status()
        return bool(reply.json()["data"]["shouldShowNux"])

    def button(self, text: str | re.Pattern[str]) -> None:
        """Click the visible button whose text is ``text`` (a string is matched whole)."""
        pattern = re.compile(rf"^{re.escape(text)}$") if isinstance(text, str) else text
        self.page.locator("button:visible").filter(has_text=pattern).first.click()

    def leave(self) -> None:
        """A blank page while the test waits for a run: a page of the UI polls the webserver
        every few seconds and renders each answer, CPU that the run waited for needs more."""
        self.page.goto("about:blank")

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@contextmanager
def browser(base_url: str, test_name: str) -> Iterator[Browser]:
    """A headless Chromium page on ``base_url``; screenshots under ``ARTIFACTS/screenshots``."""
    shots = ARTIFACTS / "screenshots" / test_name
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=chromium_path(), headless=True, args=["--no-sandbox"]
        )
        try:
            page = chromium.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)
            yield Browser(page, base_url, shots)
        finally:
            chromium.close()
