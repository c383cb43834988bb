"""What the prediction without memory costs: per character, and per Generate of 500.

    python benchmarks/bench_predictions.py                            # Session steps only
    python benchmarks/bench_predictions.py --baseline-dir ../before   # and the app's Generate

1. Session.step of the bundled model (one thread), memory full, with the counterfactual
   (the memory-off model on the last seg_len characters: txl/predictions.py) and without
   (``s.counterfactual = False``), alternating rounds: ms per character, medians.
2. With --baseline-dir: this checkout's app and the other checkout's (started one after
   the other, as bench_app.py starts them), one gradio_client session each, --rounds
   Generates of --chars characters each (the views stream as in the page): seconds per
   Generate, medians; the difference is what the page pays for the prediction without
   memory on every character.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_app import BUNDLED, ROOT, start_app, stop_app  # noqa: E402

sys.path.insert(0, str(ROOT))


def session_steps(steps: int, rounds: int) -> dict[str, float]:
    """Median ms per Session.step, with and without the counterfactual."""
    import torch

    from txl import TransformerXL
    from txl.session import Session

    torch.set_num_threads(1)
    model = TransformerXL.from_pretrained(str(BUNDLED))
    s = Session(model, seed=0)
    s.start("ROMEO:\n")
    list(s.generate(200))  # a full memory (mem_len 128)
    times = {True: [], False: []}
    for _ in range(rounds):
        for counterfactual in (True, False):
            s.counterfactual = counterfactual
            t0 = time.perf_counter()
            for _ in range(steps):
                s.step()
            times[counterfactual].append((time.perf_counter() - t0) * 1e3 / steps)
    return {
        "with_counterfactual_ms": round(statistics.median(times[True]), 2),
        "without_counterfactual_ms": round(statistics.median(times[False]), 2),
    }


def app_generate(app_dir: Path, chars: int, rounds: int) -> float:
    """Median seconds of a Generate of ``chars`` characters through the app's API."""
    from gradio_client import Client

    proc, url = start_app(str(BUNDLED), app_dir=app_dir)
    try:
        client = Client(url, verbose=False, analytics_enabled=False, ssl_verify=False)
        settings = dict(prompt="ROMEO:\n", memory=True, temperature=0.8, top_k=0, top_p=1.0)
        client.predict(n_tokens=20, seed=0, **settings, api_name="/generate")  # warm up
        seconds = []
        for seed in range(rounds):
            t0 = time.perf_counter()
            client.predict(n_tokens=chars, seed=seed, **settings, api_name="/generate")
            seconds.append(time.perf_counter() - t0)
        client.close()
        return statistics.median(seconds)
    finally:
        stop_app(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="Session steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chars", type=int, default=500, help="characters per Generate")
    parser.add_argument("--baseline-dir", type=Path, help="a checkout without predictions")
    args = parser.parse_args()

    load = os.getloadavg()[0]
    steps = session_steps(args.steps, args.rounds)
    extra = steps["with_counterfactual_ms"] - steps["without_counterfactual_ms"]
    print(
        f"Session.step, bundled model, memory 128, one thread ({args.rounds} rounds of "
        f"{args.steps}): {steps['without_counterfactual_ms']:.2f} ms without the "
        f"counterfactual, {steps['with_counterfactual_ms']:.2f} ms with it "
        f"(+{extra:.2f} ms per character, +{extra * 500 / 1e3:.1f} s per 500)"
    )
    if args.baseline_dir:
        after = app_generate(ROOT, args.chars, args.rounds)
        before = app_generate(args.baseline_dir.resolve(), args.chars, args.rounds)
        print(
            f"Generate of {args.chars} characters through the app (median of {args.rounds}): "
            f"{after:.2f} s with predictions, {before:.2f} s before them "
            f"(+{(after - before) * 1e3 / args.chars:.1f} ms per character)"
        )
    print(f"load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
