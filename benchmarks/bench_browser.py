"""The app's speed in a real browser: Debian's Chromium driven by Playwright, one user.

    python benchmarks/bench_browser.py                                # this checkout's app
    python benchmarks/bench_browser.py --baseline-dir ../wt-before    # and an older checkout's
    python benchmarks/bench_browser.py --baseline-ref main --rounds 2  # against the landed page
    python benchmarks/bench_browser.py --model tiny --steps 5         # a smoke run
    python benchmarks/bench_browser.py --baseline-ref main --generate 5 # Generate too
    python benchmarks/bench_browser.py --baseline-dir ../wt-before --json out.json --profile

Each app is started as a subprocess (``python app.py`` of its checkout, this interpreter,
its own free port; stopped at the end, also on error) and gets a fresh browser context
(empty localStorage). The page loads, the prompt is typed, --warmup Steps are clicked, then
--steps timed Steps; before the prompt and before the timed Steps, the benchmark waits
until the page's main thread is idle (its start-up is not timed). Measured, per app:

- click -> painted (median, p95 ms): from the click on Step until the page shows the new
  step's attention. The new view (webapp/web/views.js) sets ``data-position`` on its canvas'
  root; the Plotly heatmap of the app before it names the position in its title. Timed in
  the page (performance.now, checked every animation frame): no Playwright round trips.
- main thread per Step (ms): the Chrome DevTools Protocol's Performance.getMetrics before
  and after the timed Steps, divided by their number: TaskDuration (all main-thread work),
  ScriptDuration (JavaScript), LayoutDuration and RecalcStyleDuration. On a loaded machine
  this is steadier than wall time.
- Play (steps/s): Play is clicked, and after --play-seconds the position painted is read:
  the steps Play took and painted, per second (a page that paints the newest step and
  skips those between counts them all: the text has them). An app without Play: n/a.
- page start: from the page's load until its main thread is idle, wall seconds and
  main-thread ms (the wall time includes ~0.5 s of idle detection).
- --generate N: after the Steps, Generate clicked N times (it starts over from the prompt
  and streams its steps; the slider's default length): ms from the click to its first
  step's view painted and to its last's (medians), and how many step views the page
  painted (it skips those that come faster than it paints).
- localStorage (KB) at the end: what Gradio's run history kept.
- --profile: after the timed Steps, --profile-steps more under the CDP sampling profiler
  (200 µs): self time per Step by script and by function. The profiler slows the page, so
  its totals exceed the main-thread figures: read them as shares, not as times.

The baseline (--baseline-dir) is measured in the same run, right after this checkout's app,
with the same model, prompt and browser. Gradio's run history: the old app launched with
Gradio's default, which saves every event's outputs (the whole heatmap figure for each
Step) in the page's localStorage and rewrites them on each update; the new app launches
with run_history=False. So the baseline is measured in two modes:

- "run history on": the old app as it shipped;
- "run history off": the same app started with GRADIO_RUN_HISTORY=False (Gradio's own
  switch for apps that do not set run_history), so only the views differ: the fair
  comparison with the new app.

--no-run-history measures only the second. Ratios are baseline / this checkout for times
and this checkout / baseline for Play's steps/s: >1, the new app is faster. Headless
Chromium renders in software here: compare within one run.

--baseline-ref REF exports that commit of this repository (``git archive``: the landed
page is ``main``) into a temporary folder and measures it as the baseline. --rounds N
measures the apps in turn N times (this checkout, the baseline, this checkout, ...: a
machine whose load drifts weighs on both alike); each figure is the median over rounds.
Console errors (and uncaught page errors) are counted per app.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_app import (  # noqa: E402
    BUNDLED,
    ROOT,
    TINY,
    percentile,
    random_model,
    start_app,
    stop_app,
)

CHROMIUM = os.environ.get("CHROMIUM") or "/usr/bin/chromium"
FLAGS = [  # also tests/test_browser.py's: no sandbox, no GPU, no host but 127.0.0.1
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
METRICS = {
    "task": "TaskDuration",
    "script": "ScriptDuration",
    "layout": "LayoutDuration",
    "recalc_style": "RecalcStyleDuration",
}
STEP_TIMEOUT_MS = 180_000  # the old app with its run history took up to 44 s for a Step

# The text position whose attention the page shows (null before the first Step).
PAINTED_POSITION_JS = r"""() => {
  const root = document.querySelector('#attention [data-position]');
  if (root) return +root.dataset.position;
  const title = document.querySelector('#heatmap .gtitle');
  const found = title && /\(position (\d+)\)/.exec(title.textContent);
  return found ? +found[1] : null;
}"""

# Click Step, then wait (frame by frame) for the next position to be shown: the ms taken.
STEP_JS = f"""async (timeoutMs) => {{
  const position = {PAINTED_POSITION_JS};
  const before = position();
  const painted = () => before === null ? position() !== null : position() === before + 1;
  const t0 = performance.now();
  document.querySelector('#step').click();
  while (!painted()) {{
    await new Promise((resolve) => requestAnimationFrame(resolve));
    if (performance.now() - t0 > timeoutMs)
      throw new Error(`no paint after position ${{before}} within ${{timeoutMs}} ms`);
  }}
  return performance.now() - t0;
}}"""

# Click Generate (which starts over from the prompt and streams its steps), then wait for
# the view of its last step: ms from the click to the first step's view and to the last's,
# each counted to the frame after its view is set (as STEP_JS counts a Step).
GENERATE_JS = """async ({last, timeoutMs}) => {
  const seen = [];
  const onPainted = (e) => seen.push([e.detail.position, performance.now()]);
  const frame = () => new Promise((resolve) => requestAnimationFrame(resolve));
  document.addEventListener('txl-painted', onPainted);
  try {
    const t0 = performance.now();
    document.querySelector('#generate').click();
    let first = null;
    while (!seen.some(([position]) => position === last)) {
      await frame();
      if (first === null && seen.length) first = performance.now() - t0;
      if (performance.now() - t0 > timeoutMs)
        throw new Error(`Generate painted no position ${last} within ${timeoutMs} ms`);
    }
    await frame();
    return {first: first ?? performance.now() - t0, last: performance.now() - t0,
            views: seen.length};
  } finally {
    document.removeEventListener('txl-painted', onPainted);
  }
}"""

STORAGE_CHARS_JS = "Object.entries(localStorage).reduce((n, [k, v]) => n + k.length + v.length, 0)"


def step(page) -> float:
    return page.evaluate(STEP_JS, STEP_TIMEOUT_MS)


def generate(page, prompt: str) -> dict:
    """One Generate of the page's default length (the slider's value): ms to its first and
    last step painted, and how many step views the page painted."""
    chars = int(page.input_value("#n_tokens input[type=number]"))
    return page.evaluate(
        GENERATE_JS, {"last": len(prompt) + chars - 1, "timeoutMs": STEP_TIMEOUT_MS}
    )


def metrics(cdp) -> dict[str, float]:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def wait_until_idle(cdp, quiet_ms: float = 50, window_s: float = 0.5, limit_s: float = 60):
    """Until the main thread works less than quiet_ms in window_s: the page's start-up
    (scripts compiled late, components loaded lazily) must not land in the timed Steps."""
    deadline = time.time() + limit_s
    busy = metrics(cdp)["TaskDuration"]
    while time.time() < deadline:
        time.sleep(window_s)
        busy, before = metrics(cdp)["TaskDuration"], busy
        if (busy - before) * 1e3 < quiet_ms:
            return


def measure_play(page, seconds: float) -> tuple[float, float] | None:
    """(steps painted per second while Play runs, ms from the Pause click until Play has
    stopped and its last step is painted: #play's data-loop); None for an app without Play."""
    if page.locator("#play").count() == 0:
        return None
    position = f"({PAINTED_POSITION_JS})()"
    first = page.evaluate(position)
    page.click("#play")
    t0 = time.perf_counter()
    page.wait_for_timeout(seconds * 1000)
    last, elapsed = page.evaluate(position), time.perf_counter() - t0
    paused = time.perf_counter()
    page.click("#play")  # pause
    page.wait_for_function("document.querySelector('#play').innerText === 'Play'")
    page.wait_for_selector("#play[data-loop='stopped']", state="attached")
    return (last - first) / elapsed, (time.perf_counter() - paused) * 1e3


def profile_steps(page, cdp, steps: int, top: int = 15) -> dict:
    """JavaScript self time (ms per Step) under the sampling profiler, by function and script."""
    cdp.send("Profiler.enable")
    cdp.send("Profiler.setSamplingInterval", {"interval": 200})  # µs
    cdp.send("Profiler.start")
    for _ in range(steps):
        step(page)
    profile = cdp.send("Profiler.stop")["profile"]
    cdp.send("Profiler.disable")
    frames = {node["id"]: node["callFrame"] for node in profile["nodes"]}
    by_function, by_script = Counter(), Counter()
    # timeDeltas[i] is the time before sample i: sample i lasted until sample i + 1.
    durations = profile["timeDeltas"][1:] + [0]
    for node_id, us in zip(profile["samples"], durations):
        frame = frames[node_id]
        if frame["functionName"] == "(idle)":
            continue
        # No URL: the browser's own work (layout, style, paint: "(program)") and DOM calls,
        # or a script the page inlined (the app's views.js comes in the page's head).
        script = frame["url"].rsplit("/", 1)[-1].split("?")[0] or "(native or inline)"
        by_function[f"{frame['functionName'] or '(anonymous)'} @ {script}"] += us
        by_script[script] += us

    def per_step(counter):
        return [[name, round(us / 1e3 / steps, 1)] for name, us in counter.most_common(top)]

    return {"steps": steps, "by_function": per_step(by_function), "by_script": per_step(by_script)}


def measure_app(browser, label: str, url: str, args) -> dict:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(STEP_TIMEOUT_MS)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        t0 = time.perf_counter()
        page.goto(url, wait_until="load")
        page.wait_for_selector("#prompt textarea")
        wait_until_idle(cdp)
        # Paid once per visit: the page's load and start-up, until its main thread is idle.
        start = {
            "wall_s": round(time.perf_counter() - t0, 2),
            "main_thread_ms": round(metrics(cdp)["TaskDuration"] * 1e3),
        }
        page.fill("#prompt textarea", args.prompt)
        for _ in range(args.warmup):
            step(page)
        wait_until_idle(cdp)
        before = metrics(cdp)
        step_ms = [step(page) for _ in range(args.steps)]
        after = metrics(cdp)
        result = {
            "label": label,
            "url": url,
            "page_start": start,
            "click_to_painted_ms": {
                "median": round(statistics.median(step_ms), 1),
                "p95": round(percentile(step_ms, 95), 1),
                "max": round(max(step_ms), 1),
                "all": [round(ms, 1) for ms in step_ms],
            },
            "main_thread_ms_per_step": {
                key: round((after[name] - before[name]) * 1e3 / args.steps, 1)
                for key, name in METRICS.items()
            },
        }
        if args.profile:
            result["profile"] = profile_steps(page, cdp, args.profile_steps)
        if args.generate:
            runs = [generate(page, args.prompt) for _ in range(args.generate)]
            result["generate_ms"] = {
                "first": [round(r["first"], 1) for r in runs],
                "last": [round(r["last"], 1) for r in runs],
                "views": [r["views"] for r in runs],
            }
        play = measure_play(page, args.play_seconds)
        result["play_steps_per_s"] = None if play is None else round(play[0], 2)
        result["pause_to_still_ms"] = None if play is None else round(play[1])
        result["local_storage_kb"] = round(page.evaluate(STORAGE_CHARS_JS) / 1e3, 1)
        result["page_errors"] = errors
        return result
    finally:
        context.close()


def run_app(browser, label: str, app_dir: Path, model: str, extra_env: dict, args) -> dict:
    proc, url = start_app(model, app_dir=app_dir, extra_env=extra_env)
    print(f"{label}: {app_dir}/app.py at {url}", flush=True)
    try:
        result = measure_app(browser, label, url, args)
    finally:
        stop_app(proc)
    result["app_dir"] = str(app_dir)
    result["env"] = extra_env
    return result


def print_table(results: list[dict]) -> None:
    print()
    print(f"{'':32s} click -> painted (ms)    main thread per Step (ms)      Play   localStorage")
    print(f"{'app':32s}  median     p95      task  script  layout  style  steps/s     KB")
    for r in results:
        c, m, play = r["click_to_painted_ms"], r["main_thread_ms_per_step"], r["play_steps_per_s"]
        play_text = "n/a" if play is None else f"{play:.2f}"
        print(
            f"{r['label']:32s} {c['median']:7.0f} {c['p95']:7.0f}   {m['task']:7.0f} "
            f"{m['script']:7.0f} {m['layout']:7.0f} {m['recalc_style']:6.0f}  {play_text:>7s}"
            f"  {r['local_storage_kb']:7.1f}"
        )
    for r in results:
        if "generate_ms" in r:
            g = r["generate_ms"]
            print(
                f"{r['label']:32s} Generate: click -> first step painted {g['first_median']:.0f}"
                f" ms, -> last {g['last_median']:.0f} ms (medians of {len(g['first'])}); step"
                f" views painted {statistics.median(g['views']):.0f}"
            )
    for r in results:
        start = r["page_start"]
        print(
            f"{r['label']:32s} page start (load until idle): {start['wall_s']:.1f} s wall, "
            f"{start['main_thread_ms']} ms main thread"
        )


def ratios(after: dict, baseline: dict) -> dict:
    """baseline / after for each median-like time, after / baseline for Play's steps/s
    (>1: the new app is faster)."""
    a, b = after["click_to_painted_ms"]["median"], baseline["click_to_painted_ms"]["median"]
    out = {"click_to_painted_median": round(b / a, 2) if a else None}
    for key in METRICS:
        a, b = after["main_thread_ms_per_step"][key], baseline["main_thread_ms_per_step"][key]
        out[f"main_thread_{key}"] = round(b / a, 2) if a else None
    a, b = after["play_steps_per_s"], baseline["play_steps_per_s"]
    out["play_steps_per_s"] = round(a / b, 2) if a is not None and b else None
    if "generate_ms" in after and "generate_ms" in baseline:
        for key in ("first", "last"):
            a, b = after["generate_ms"][f"{key}_median"], baseline["generate_ms"][f"{key}_median"]
            out[f"generate_{key}"] = round(b / a, 2)
    return out


def median_of_rounds(rounds: list[dict]) -> dict:
    """One app's figures over its rounds: each the median of the rounds' (click ->
    painted: of every timed Step of every round)."""
    first = rounds[0]
    steps = [ms for r in rounds for ms in r["click_to_painted_ms"]["all"]]
    generated = {}
    if "generate_ms" in first:
        for key in ("first", "last", "views"):
            generated[key] = [x for r in rounds for x in r["generate_ms"][key]]
        generated["first_median"] = round(statistics.median(generated["first"]), 1)
        generated["last_median"] = round(statistics.median(generated["last"]), 1)
    plays = [r["play_steps_per_s"] for r in rounds if r["play_steps_per_s"] is not None]
    return {
        **first,
        "rounds": len(rounds),
        "page_start": {
            k: statistics.median(r["page_start"][k] for r in rounds) for k in first["page_start"]
        },
        "click_to_painted_ms": {
            "median": round(statistics.median(steps), 1),
            "p95": round(percentile(steps, 95), 1),
            "max": round(max(steps), 1),
            "all": steps,
        },
        "main_thread_ms_per_step": {
            k: round(statistics.median(r["main_thread_ms_per_step"][k] for r in rounds), 1)
            for k in METRICS
        },
        "play_steps_per_s": round(statistics.median(plays), 2) if plays else None,
        "play_steps_per_s_rounds": [r["play_steps_per_s"] for r in rounds],
        "pause_to_still_ms_rounds": [r["pause_to_still_ms"] for r in rounds],
        "local_storage_kb": max(r["local_storage_kb"] for r in rounds),
        "page_errors": [e for r in rounds for e in r["page_errors"]],
        **({"generate_ms": generated} if generated else {}),
    }


def print_profile(result: dict) -> None:
    profile = result["profile"]
    print(f"\n{result['label']}: self time, ms per Step ({profile['steps']} Steps profiled)")
    for title, rows in (
        ("by script", profile["by_script"]),
        ("by function", profile["by_function"]),
    ):
        print(f"  {title}:")
        for name, ms in rows:
            print(f"    {ms:7.1f}  {name}")


def export_commit(ref: str, folder: Path) -> None:
    """This repository's ``ref`` (a branch, tag or commit) as files in ``folder``."""
    folder.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed Steps per app")
    parser.add_argument("--warmup", type=int, default=3, help="Steps before the timed ones")
    parser.add_argument("--prompt", default="ROMEO:\n")
    parser.add_argument("--play-seconds", type=float, default=6.0)
    parser.add_argument(
        "--model", help="model folder or Hub id (default: the bundled weights); tiny: the tests'"
    )
    parser.add_argument("--baseline-dir", type=Path, help="another checkout to compare with")
    parser.add_argument(
        "--baseline-ref", help="a commit of this repository to compare with (e.g. main)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="measure the apps in turn N times")
    parser.add_argument(
        "--no-run-history",
        action="store_true",
        help="measure the baseline only with Gradio's run history off",
    )
    parser.add_argument(
        "--generate",
        type=int,
        default=0,
        help="after the Steps, click Generate this many times (the page's default length): "
        "click -> its first and its last step painted",
    )
    parser.add_argument("--profile", action="store_true", help="JS self time per function")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--json", help="also write every number to this file")
    args = parser.parse_args()

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no Chromium at {CHROMIUM}: run scripts/install-chromium.sh")
    from playwright.sync_api import sync_playwright

    tmp = tempfile.TemporaryDirectory(prefix="txl-bench-browser-")
    model = args.model
    if model is None:
        model = str(BUNDLED) if (BUNDLED / "model.safetensors").exists() else None
    if model is None or model == "tiny":
        shape = TINY if model == "tiny" else None
        model = random_model(Path(tmp.name) / (model or "random"), shape)
    apps = [("after (this checkout)", ROOT, {})]
    if args.baseline_ref:
        args.baseline_dir = Path(tmp.name) / "baseline"
        export_commit(args.baseline_ref, args.baseline_dir)
    if args.baseline_dir:
        baseline = args.baseline_dir.resolve()
        if not args.no_run_history:
            apps.append(("before, run history on", baseline, {}))
        apps.append(("before, run history off", baseline, {"GRADIO_RUN_HISTORY": "False"}))

    load_before = os.getloadavg()
    print(f"model {model}; {args.steps} Steps per app; load average {load_before[0]:.2f}")
    rounds = {label: [] for label, _, _ in apps}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
            try:
                for _ in range(args.rounds):
                    for label, app_dir, extra_env in apps:
                        result = run_app(browser, label, app_dir, model, extra_env, args)
                        rounds[label].append(result)
            finally:
                browser.close()
    finally:
        tmp.cleanup()
    load_after = os.getloadavg()
    results = [median_of_rounds(rounds[label]) for label, _, _ in apps]

    print_table(results)
    report = {
        "model": model,
        "prompt": args.prompt,
        "steps": args.steps,
        "warmup": args.warmup,
        "play_seconds": args.play_seconds,
        "rounds": args.rounds,
        "baseline_ref": args.baseline_ref,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "cpus": os.cpu_count(),
        "apps": results,
        "ratios_baseline_over_after": {},
    }
    for baseline in results[1:]:
        r = ratios(results[0], baseline)
        report["ratios_baseline_over_after"][baseline["label"]] = r
        print(
            f"{baseline['label']} / after: click -> painted median {r['click_to_painted_median']}x,"
            f" main thread task {r['main_thread_task']}x, script {r['main_thread_script']}x,"
            f" layout {r['main_thread_layout']}x, style {r['main_thread_recalc_style']}x;"
            f" Play steps/s (after / before) {r['play_steps_per_s']}x"
            + (
                f"; Generate: to the first step {r['generate_first']}x, to the last"
                f" {r['generate_last']}x"
                if "generate_first" in r
                else ""
            )
        )
    print(f"load average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end")
    for r in results:
        print(f"{r['label']}: {len(r['page_errors'])} console errors {r['page_errors'][:3]}")
        if "profile" in r:
            print_profile(r)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
