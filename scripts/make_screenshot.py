"""Make docs/images/screenshot.png (the README's picture of the app) with a real browser.

    python scripts/make_screenshot.py                      # the bundled weights
    python scripts/make_screenshot.py --model path/or/id   # any other model

Starts the app in-process on 127.0.0.1, generates from a prompt, steps once so that the
newest character and its attention show, and saves a desktop-width screenshot. Needs
Debian's chromium (/usr/bin/chromium) and the playwright package (no downloaded browser).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "weights" / "shakespeare-char"))
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "screenshot.png"))
    parser.add_argument("--prompt", default="ROMEO:\n")
    parser.add_argument("--chars", type=int, default=220, help="characters to generate")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()

    import torch
    from playwright.sync_api import sync_playwright

    import app
    from tests.test_app import serve  # the tests' launch on 127.0.0.1
    from tests.test_browser import FLAGS  # and their browser flags: loopback only

    torch.set_num_threads(1)
    txl_app = app.Demo.serving(args.model)
    if txl_app.service.load_error:
        raise SystemExit(txl_app.service.load_error)
    demo, url = serve(txl_app)
    try:
        with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
            context = p.chromium.launch_persistent_context(
                profile,
                executable_path=args.chromium,
                args=FLAGS,
                headless=True,
                viewport={"width": args.width, "height": 1000},
                device_scale_factor=1,
            )
            page = context.new_page()
            page.set_default_timeout(120_000)
            page.goto(url, wait_until="load")
            page.fill("#prompt textarea", args.prompt)
            page.fill("#n_tokens input[type=number]", str(args.chars))
            page.press("#n_tokens input[type=number]", "Enter")
            page.click("#generate")
            target = len(args.prompt) + args.chars
            # Generate is done when its last step's views are painted (the text's innerText
            # would count a newest new line twice: it is drawn as ↵ and a line break).
            page.wait_for_selector(f"#attention [data-position='{target - 1}']")
            page.click("#step")
            # The Step's views are painted when the attention view carries its position.
            page.wait_for_selector(f"#attention [data-position='{target}']")
            page.hover(f"#text .txl-k[data-i='{target - 3}']")  # show a character's weight
            page.screenshot(path=args.out, full_page=True)
            context.close()
    finally:
        demo.close()
    print(f"saved {args.out} ({args.model})")


if __name__ == "__main__":
    main()
