"""The headless Chromium the browser tests drive through Playwright: Debian's system browser
(`scripts/test` installs it; Playwright never downloads a build of its own) and its flags."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
