"""Make docs/images/moments.png and docs/images/window-line.png (the README's pictures of "where
memory mattered" and of the window line) in a real browser.

    python scripts/make_moments_screenshot.py            # the bundled weights

Starts the app (python app.py, a free port), scores the balcony scene in the Score tab,
waits for its moments (after the sliding window) and saves that section; then presses
Watch it on the first moment, Steps once (the Step writes the moment's own character) and
saves the Watch tab's main row: the window line in the attention view and the text, the
bars with memory and without. Needs Debian's chromium and playwright.
"""

from __future__ import annotations

import argparse

from _app_page import BUNDLED, ROOT, app_page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--moments", default=str(ROOT / "docs" / "images" / "moments.png"))
    parser.add_argument("--window", default=str(ROOT / "docs" / "images" / "window-line.png"))
    args = parser.parse_args()
    with app_page(args.model, 1400, 1000, timeout_ms=600_000) as page:
        page.wait_for_selector("#step")
        page.get_by_role("tab", name="Does memory help?").click()
        page.click("#score_btn")  # the balcony scene is in the box
        page.wait_for_selector("#moments .txl-moments[data-moments]")
        first = int(page.get_attribute("#moments .txl-moments", "data-moments").split(",")[0])
        page.hover(f"#moments .txl-mom-text [data-i='{first}']")
        page.locator("#moments").screenshot(path=args.moments)
        print(page.inner_text("#moments .txl-mom-list"))

        page.click("#watch_it")
        page.wait_for_selector(f'#attention [data-position="{first - 1}"]')
        page.click("#step")
        page.wait_for_selector(f'#predictions .txl-pred[data-position="{first}"]')
        page.wait_for_selector(f'#attention [data-position="{first}"]')
        page.mouse.move(0, 0)
        page.locator("#main-row").screenshot(path=args.window)
        print(page.inner_text("#status"))
        print(page.inner_text("#predictions .txl-pred-words"))
    print(f"wrote {args.moments} and {args.window}")


if __name__ == "__main__":
    main()
