"""Make docs/images/predictions.png (the README's picture of the two bar lists) in a real browser.

    python scripts/make_predictions_screenshot.py            # the bundled weights, 320 Steps

Starts the app (python app.py, a free port), types a prompt from Romeo and Juliet, clicks
Step --steps times, waiting each time for the bars of the new step, and remembers the
step (after the first 40, when the memory is full) where memory saved the most bits on
the sampled character. Then it shades the text by memory's effect, moves the step history
back to that step and saves the page's main row. Needs Debian's chromium and playwright.
"""

from __future__ import annotations

import argparse

from _app_page import BUNDLED, ROOT, app_page

PROMPT = (
    "ROMEO:\nShe speaks, yet she says nothing: what of that?\n"
    "Her eye discourses; I will answer it.\n\nJULIET:\nAy me!\n\nROMEO:\n"
    "She speaks:\nO, speak again, bright angel!\n\nJULIET:\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--steps", type=int, default=320)
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "predictions.png"))
    args = parser.parse_args()
    with app_page(args.model, 1400, 1000, timeout_ms=120_000) as page:
        page.wait_for_selector("#prompt textarea")
        page.fill("#prompt textarea", PROMPT)
        best = None  # (position, bits saved)
        for i in range(args.steps):
            position = len(PROMPT) + i
            page.click("#step")
            page.wait_for_selector(f'#predictions .txl-pred[data-position="{position}"]')
            saved = float(page.get_attribute("#predictions .txl-pred", "data-bits-saved"))
            if i >= 40 and (best is None or saved > best[1]):
                best = (position, saved)
        page.click("#text button[data-shade='effect']")
        page.wait_for_selector("#text .txl-textview[data-shade='effect']")
        page.fill("#history input[type=number]", str(best[0] - position))
        page.press("#history input[type=number]", "Enter")
        page.wait_for_selector(f'#predictions .txl-pred[data-position="{best[0]}"]')
        page.wait_for_selector(f'#attention [data-position="{best[0]}"]')
        page.mouse.move(0, 0)
        page.locator("#main-row").screenshot(path=args.out)
        print(f"step {best[0]}: {page.inner_text('#predictions .txl-pred-words')}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
