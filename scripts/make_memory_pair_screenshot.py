"""Make docs/images/memory-pair.png (the README's picture of the "Memory on | off" tab) in
a real browser.

    python scripts/make_memory_pair_screenshot.py            # the bundled weights

Starts the app (python app.py, a free port), opens the tab, picks the first example of
webapp/tabs/memory_pairs.json (scripts/find_memory_pairs.py: a scene where the memory side
names a speaker from beyond the window and the window side invents one), presses Generate
and saves the tab once every character is painted; prints its status line and parting
point. Needs Debian's chromium and playwright.
"""

from __future__ import annotations

import argparse
import json
import sys

from _app_page import BUNDLED, ROOT, app_page

sys.path.insert(0, str(ROOT))
from webapp.tabs.memory_pair import EXAMPLES_LABEL, example_label  # noqa: E402

VIEW = "#pair_view .txl-pair"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "memory-pair.png"))
    parser.add_argument("--example", type=int, default=0, help="which example (default 0)")
    args = parser.parse_args()
    report = json.loads((ROOT / "webapp" / "tabs" / "memory_pairs.json").read_text())
    example = report["examples"][args.example]
    n = example["n"]
    with app_page(args.model, 1400, 1100, timeout_ms=300_000) as page:
        page.wait_for_selector("#step")
        page.get_by_role("tab", name="Memory on | off").click()
        page.get_by_label(EXAMPLES_LABEL, exact=True).click()
        page.get_by_role("option", name=example_label(example), exact=True).click()
        # every field the example sets, not only n (200 is also the default: already true)
        page.wait_for_function(
            "([n, seed, prompt]) => document.querySelector('#pair_n input[type=number]').value"
            " === n && document.querySelector('#pair_seed input').value === seed"
            " && document.querySelector('#pair_prompt textarea').value === prompt",
            arg=[str(n), str(example["seed"]), example["prompt"]],
        )
        page.click("#pair_generate")
        page.wait_for_selector(f'{VIEW}[data-steps="{n}"]', state="attached")
        page.mouse.move(0, 0)
        page.get_by_role("tabpanel").screenshot(path=args.out)
        print(page.inner_text("#pair_status"))
        print(page.inner_text(f"{VIEW} .txl-pair-part"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
