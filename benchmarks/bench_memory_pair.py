"""The "Memory on | off" tab's speed beside the Watch tab's, in one run of one app and one
browser page (benchmarks/bench_browser.py's machinery: Debian's Chromium, Playwright).

    nice -n 19 python benchmarks/bench_memory_pair.py                 # the bundled model
    nice -n 19 python benchmarks/bench_memory_pair.py --rounds 4 --steps 8

Measured:

- click -> painted (ms, median over every timed Step): a Watch Step (from the click until
  the attention view shows the new position: bench_browser.STEP_JS) and a pair Step (until
  the pair view shows one more step: its ``data-steps``). The two are measured in turn,
  ``--steps`` of each per round over ``--rounds`` rounds, each tab selected while its own
  Steps run (a hidden view is not painted), so that a machine whose load drifts weighs on
  both alike. The ratio pair / Watch is the figure the issue sets (<= 1.3x, floor 1.6x).
- Generate of ``--generate`` characters, each after a Reset: ms from the click until the
  first characters are painted (data-steps >= 1), and until all are.
- In the server's process (no page): what one step of each side costs, the memory side
  (one token over the memory) and the window side (a forward over the window, from scratch),
  medians over ``--model-steps`` steps, one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_app import BUNDLED, start_app, stop_app  # noqa: E402
from bench_browser import CHROMIUM, FLAGS, STEP_TIMEOUT_MS, step, wait_until_idle  # noqa: E402

PROMPT = "ROMEO:\nI will not stay.\n\nJULIET:\nNo"
VIEW = "#pair_view .txl-pair"

# Click the pair's Step, then wait (frame by frame) for one more step painted: the ms.
PAIR_STEP_JS = f"""async (timeoutMs) => {{
  const steps = () => +(document.querySelector('{VIEW}')?.dataset.steps || 0);
  const before = steps(), t0 = performance.now();
  document.querySelector('#pair_step').click();
  while (steps() !== before + 1) {{
    await new Promise((resolve) => requestAnimationFrame(resolve));
    if (performance.now() - t0 > timeoutMs) throw new Error(`no pair step after ${{before}}`);
  }}
  return performance.now() - t0;
}}"""

# Click Generate; the ms until the first characters are painted, and until n are.
GENERATE_JS = f"""async ([n, timeoutMs]) => {{
  const steps = () => +(document.querySelector('{VIEW}')?.dataset.steps || 0);
  const t0 = performance.now();
  let first = null;
  document.querySelector('#pair_generate').click();
  while (steps() !== n) {{
    await new Promise((resolve) => requestAnimationFrame(resolve));
    if (first === null && steps() >= 1 && steps() < n) first = performance.now() - t0;
    if (performance.now() - t0 > timeoutMs) throw new Error(`generate stopped at ${{steps()}}`);
  }}
  return [first, performance.now() - t0];
}}"""


def select(page, tab: str, ready: str) -> None:
    page.get_by_role("tab", name=tab).click()
    page.wait_for_selector(ready, state="visible")


def browser_figures(url: str, args) -> dict:
    from playwright.sync_api import sync_playwright

    watch_ms, pair_ms = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(STEP_TIMEOUT_MS)
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            page.goto(url, wait_until="load")
            page.wait_for_selector("#prompt textarea")
            page.fill("#prompt textarea", PROMPT)
            select(page, "Memory on | off", "#pair_prompt textarea")
            page.fill("#pair_prompt textarea", PROMPT)
            wait_until_idle(cdp)
            for r in range(args.rounds + 1):  # round 0 warms both up, untimed
                select(page, "Watch the memory", "#step")
                times = [step(page) for _ in range(args.steps)]
                watch_ms += times if r else []
                select(page, "Memory on | off", "#pair_step")
                times = [page.evaluate(PAIR_STEP_JS, STEP_TIMEOUT_MS) for _ in range(args.steps)]
                pair_ms += times if r else []
            n = args.generate
            page.fill("#pair_n input[type=number]", str(n))
            page.press("#pair_n input[type=number]", "Enter")
            generate = []
            for _ in range(args.generates):  # each from an empty view: its first paint shows
                page.click("#pair_reset")
                page.wait_for_selector(f'{VIEW}[data-steps="0"]', state="attached")
                generate.append(page.evaluate(GENERATE_JS, [n, 600_000]))
        finally:
            browser.close()
    return {
        "watch_step_ms": watch_ms,
        "pair_step_ms": pair_ms,
        "generate_first_ms": [round(g[0], 1) for g in generate if g[0] is not None],
        "generate_all_ms": [round(g[1], 1) for g in generate],
    }


def model_figures(model_dir: str, steps: int) -> dict:
    """Median ms of one step of each side of a MemoryPair, in this process."""
    import torch

    from txl import TransformerXL
    from txl.counterfactual import MemoryPair

    torch.set_num_threads(1)
    model = TransformerXL.from_pretrained(model_dir)
    pair = MemoryPair(model, temperature=0.8, seed=0)
    pair.start(PROMPT)
    memory_ms, window_ms = [], []
    for t in range(steps):
        g = pair.noise(t)
        t0 = time.perf_counter()
        pair.with_memory.step(capture=True, terms=False, gumbel=g)
        t1 = time.perf_counter()
        pair.without_memory.step(capture=False, terms=False, gumbel=g)
        t2 = time.perf_counter()
        memory_ms.append((t1 - t0) * 1e3)
        window_ms.append((t2 - t1) * 1e3)
    return {
        "memory_side_ms": round(statistics.median(memory_ms), 2),
        "window_side_ms": round(statistics.median(window_ms), 2),
        "window_tokens": pair.without_memory.seg_len,
        "mem_len": pair.with_memory.mem_len,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(BUNDLED), help="model folder (the bundled one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="Steps of each tab per round")
    parser.add_argument("--generate", type=int, default=200)
    parser.add_argument("--generates", type=int, default=3, help="Generates timed")
    parser.add_argument("--model-steps", type=int, default=200)
    parser.add_argument("--json", help="also write every number to this file")
    args = parser.parse_args()

    load = os.getloadavg()[0]
    proc, url = start_app(args.model)
    try:
        figures = browser_figures(url, args)
    finally:
        stop_app(proc)
    figures.update(model_figures(args.model, args.model_steps))
    watch = statistics.median(figures["watch_step_ms"])
    pair = statistics.median(figures["pair_step_ms"])
    figures["ratio_pair_over_watch"] = round(pair / watch, 2)
    figures["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    n = len(figures["watch_step_ms"])
    print(f"model {args.model}; {n} Steps of each tab in {args.rounds} rounds")
    print(f"click -> painted, median: Watch Step {watch:.0f} ms, pair Step {pair:.0f} ms")
    print(f"pair / Watch: {figures['ratio_pair_over_watch']}x")
    first, whole = figures["generate_first_ms"], figures["generate_all_ms"]
    print(
        f"Generate {args.generate}: first characters painted after "
        f"{statistics.median(first):.0f} ms (median of {len(first)}), all after "
        f"{statistics.median(whole):.0f} ms"
    )
    print(
        f"one step in the server's process, median of {args.model_steps}: memory side "
        f"{figures['memory_side_ms']} ms (memory {figures['mem_len']}), window side "
        f"{figures['window_side_ms']} ms (a forward over {figures['window_tokens']} tokens)"
    )
    start, end = figures["load_average"]
    print(f"load average {start} at the start, {end} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
