"""Make docs/images/recall.png (the README's picture of "How far back can it recall?") in a
real browser.

    python scripts/make_recall_screenshot.py            # the bundled weights, ZANTHOR

Starts the app (python app.py, a free port), opens the tab, clicks Probe with the tab's
defaults, waits until all seven distances are read and saves the tab. Needs Debian's
chromium and playwright.
"""

from __future__ import annotations

import argparse

from _app_page import BUNDLED, ROOT, app_page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "recall.png"))
    args = parser.parse_args()
    with app_page(args.model, 1400, 900, timeout_ms=120_000) as page:
        page.get_by_role("tab", name="How far back can it recall?").click()
        page.click("#recall_btn")
        page.wait_for_function(
            "document.querySelector('#recall_summary')?.innerText"
            ".includes('distances read in')"
        )
        page.wait_for_selector("#recall_plot .scatterlayer .trace")
        page.mouse.move(0, 0)
        page.locator("#recall_summary").locator("xpath=../..").screenshot(path=args.out)
        print(page.inner_text("#recall_summary"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
