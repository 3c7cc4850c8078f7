"""The headless Chromium the browser tests drive through Playwright: Debian's system browser
(`scripts/test` installs it; Playwright never downloads a build of its own) and its flags."""

from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


async def log_in_to_airflow(page: Any, url: str, user: str = "admin",
                            password: str = "admin-pw") -> None:
    """Log `page` in to the Airflow UI at `url` through SimpleAuthManager's login form, and
    return once the UI shows its navigation: the login's own navigation (the form's POST, its
    redirects) has ended, so a ``goto`` made next is not aborted by it (``net::ERR_ABORTED``)."""
    await page.goto(url + "/", timeout=120_000)
    await page.locator("input[name=username]").fill(user)
    await page.locator("input[name=password]").fill(password)
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("button", name="Browse").wait_for(timeout=120_000)
