"""Many visitors, one machine: the app's memory under many sessions (issue 14).

Two measurements, each against ``python app.py`` started here as a subprocess:

    # what one session costs the server: RSS growth per session / its keys and values
    python benchmarks/bench_soak.py --per-session --sessions 40 --mem-len 2048
    python benchmarks/bench_soak.py --per-session --root /tmp/before   # another checkout

    # the budget's account (issue 27): RSS above the start against TXL_MEMORY_BUDGET_MB
    python benchmarks/bench_soak.py --per-session --sessions 30 --mem-len 2048 \
        --env TXL_MEMORY_BUDGET_MB=400

    # the speed side of one malloc arena (tune_allocator): two sessions at once, 1 vs 2
    python benchmarks/bench_soak.py --arenas --repeats 3

    # the soak: sessions fill long memories, Step in turns and all at once, under a budget
    python benchmarks/bench_soak.py --sessions 120 --budget-mb 200 --rounds 4 --check

--per-session: every session sends the 2,044-character balcony scene as its prompt and
takes one Step (memory mem_len), from --clients clients at once; RSS is read after
--warm sessions (default none: the app just started, as a Space's first visitors find
it) and after the sessions, and the growth per session is set against the session's
keys and values. Under a budget (--env TXL_MEMORY_BUDGET_MB=N) it also reports the RSS
above the start set against the budget, in all and in anonymous memory alone.

The soak reports sessions served, RSS over time (peak vs budget + baseline), offloads
(from the status line: "memory restored from disk in N ms") and the restore latency
p50 / p95 as the visitor's status line reports it. --check also runs every session alone
in this process (txl.Session, no server) and requires the same text at every Step.
tests/test_soak.py runs a small soak in CI with the functions below.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import httpx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_app import percentile, start_app, stop_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "weights" / "shakespeare-char"
RESTORED = re.compile(r"memory restored from disk in ([\d,]+) ms")


# ---- the app as a subprocess (bench_app.start_app / stop_app) ------------------------


def rss_mb(pid: int, kind: str = "VmRSS") -> float:
    """The process's resident memory in MB: all of it (VmRSS), or its anonymous part
    (RssAnon: the heap, without the pages of code and files mapped)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{kind}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {kind} for {pid}")


class RSSWatch:
    """The process's RSS every ``every`` seconds, in a thread: (seconds, MB) pairs."""

    def __init__(self, pid: int, every: float = 0.2):
        self.pid, self.every, self.samples = pid, every, []
        self._done = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.every):
            self.samples.append((time.monotonic() - self._t0, rss_mb(self.pid)))

    def stop(self) -> list[tuple[float, float]]:
        self._done.set()
        self._thread.join()
        return self.samples


# ---- one session's Step, as any HTTP client sends it ----------------------------------


def step(url: str, plan: dict, client: httpx.Client) -> tuple[str, float | None]:
    """One Step of a session (plan: hash, prompt, mem_len, seed): (text, restore ms)."""
    sys.path.insert(0, str(ROOT))
    from tests.raw_api import call

    data = [plan["prompt"], True, plan["mem_len"], 1.0, 0, 1.0, plan["seed"], None, None]
    ok, result = call(url, "step", data, plan["hash"], client)
    if not ok:
        raise RuntimeError(f"session {plan['seed']}: {result}")
    restored = RESTORED.search(result[2] or "")
    return result[0], float(restored.group(1).replace(",", "")) if restored else None


def plans(n: int, prompt_chars: int, mem_len: int, text: str) -> list[dict]:
    """Session i: its own slice of ``text`` as the prompt, seed i, its own hash."""
    text = text * (1 + (prompt_chars + n) // max(1, len(text)))
    return [
        dict(hash=uuid.uuid4().hex, prompt=text[i : i + prompt_chars], mem_len=mem_len, seed=i)
        for i in range(n)
    ]


def alone(model_folder: str, plan: dict, steps: int) -> list[str]:
    """The texts the same session writes alone (in this process, no server): the app's
    Step starts from the prompt with the seed, then steps."""
    sys.path.insert(0, str(ROOT))
    from txl import TransformerXL
    from txl.session import Session

    model = _model(model_folder, TransformerXL)
    s = Session(model, mem_len=plan["mem_len"], temperature=1.0, seed=plan["seed"])
    s.start(plan["prompt"])
    texts = []
    for _ in range(steps):
        s.step()
        texts.append(s.text)
    return texts


_MODELS: dict = {}


def _model(folder: str, cls):
    if folder not in _MODELS:
        _MODELS[folder] = cls.from_pretrained(folder)
    return _MODELS[folder]


# ---- the soak ---------------------------------------------------------------------------


def soak(url: str, sessions: list[dict], rounds: int, threads: int) -> dict:
    """Every session Steps once to fill its memory from its prompt; then ``rounds``
    rounds, alternately in turns (one session after another) and all at once
    (``threads`` clients stepping their own share of the sessions at the same time).
    Returns each session's texts, the restores' latency and the errors."""
    texts = {p["hash"]: [] for p in sessions}
    restores: list[float] = []
    errors: list = []
    lock = threading.Lock()

    def run(part: list[dict], times: int) -> None:
        with httpx.Client(timeout=300) as client:
            for _ in range(times):
                for plan in part:
                    try:
                        text, restored = step(url, plan, client)
                    except BaseException as e:
                        with lock:
                            errors.append(e)
                        return
                    with lock:
                        texts[plan["hash"]].append(text)
                        if restored is not None:
                            restores.append(restored)

    def at_once(times: int) -> None:
        workers = [
            threading.Thread(target=run, args=(sessions[t::threads], times)) for t in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    at_once(1)  # fill: every session feeds its prompt
    for r in range(rounds):
        if r % 2 == 0:
            run(sessions, 1)  # in turns
        else:
            at_once(1)
        if errors:
            break
    return dict(texts=texts, restores_ms=restores, errors=errors, steps=1 + rounds)


def kv_bytes(model_folder: str, positions: int) -> int:
    """Keys and values of ``positions`` positions (no spare room)."""
    config = json.loads((Path(model_folder) / "config.json").read_text())
    return 2 * config["n_layer"] * config["n_head"] * config["d_head"] * 4 * positions


# ---- main --------------------------------------------------------------------------------


def balcony() -> str:
    """The Score tab's first example (read from the source: no gradio import needed)."""
    tabs = ROOT / "webapp" / "tabs"
    homes = [tabs / "examples.py", tabs / "score.py", ROOT / "app.py"]
    source = next(p for p in homes if p.exists()).read_text()
    start = source.index('ROMEO_AND_JULIET = """\\\n') + len('ROMEO_AND_JULIET = """\\\n')
    return source[start : source.index('"""', start)]


def per_session(args, model: str, log: Path) -> dict:
    env = dict(TXL_SESSION_TTL=3600, TXL_MAX_SESSIONS=1000, TXL_CONCURRENCY=2)
    env.update(dict(kv.split("=", 1) for kv in args.env))
    proc, url = start_app(model, app_dir=Path(args.root), extra_env=env, log=log)
    try:
        text = balcony()
        with httpx.Client(timeout=600) as client:
            for plan in plans(args.warm, len(text), args.mem_len, text):
                step(url, plan, client)
            time.sleep(2)
            before, anon_before = rss_mb(proc.pid), rss_mb(proc.pid, "RssAnon")
            sessions = plans(args.sessions, len(text), args.mem_len, text)
            errors: list = []

            def client_steps(part: list[dict]) -> None:
                with httpx.Client(timeout=600) as own:
                    try:
                        for plan in part:
                            step(url, plan, own)
                    except BaseException as e:
                        errors.append(e)

            clients = [
                threading.Thread(target=client_steps, args=(sessions[c :: args.clients],))
                for c in range(args.clients)
            ]
            for c in clients:
                c.start()
            for c in clients:
                c.join()
            if errors:
                raise errors[0]
            time.sleep(2)
            after, anon_after = rss_mb(proc.pid), rss_mb(proc.pid, "RssAnon")
    finally:
        stop_app(proc)
    positions = min(args.mem_len, len(text) + 1)
    kv = kv_bytes(model, positions) / 2**20
    per = (after - before) / args.sessions
    budget = env.get("TXL_MEMORY_BUDGET_MB")
    # under a budget: the growth of RSS set against it (issue 27: at most 1.1x)
    against_budget = (
        dict(
            budget_mb=float(budget),
            above_start_to_budget=round((after - before) / float(budget), 3),
            anon_above_start_to_budget=round((anon_after - anon_before) / float(budget), 3),
        )
        if budget
        else {}
    )
    return dict(
        root=str(args.root),
        sessions=args.sessions,
        mem_len=args.mem_len,
        warm=args.warm,
        clients=args.clients,
        rss_before_mb=round(before, 1),
        rss_after_mb=round(after, 1),
        per_session_mb=round(per, 2),
        kv_per_session_mb=round(kv, 2),
        goal_mb=round(1.5 * kv + 2, 2),
        ratio_to_kv=round(per / kv, 2),
        **against_budget,
    )


# ---- one arena or two: the speed of two sessions at once ---------------------------------


def arenas_child(arenas: int, mem_len: int = 2048, steps: int = 100) -> dict:
    """In a fresh process with ``arenas`` malloc arenas: two sessions, each in its own
    thread at the same time (as two visitors' requests run), feed the balcony scene with
    memory mem_len, then take ``steps`` Steps each (counterfactual and terms included)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from txl import TransformerXL, budget
    from txl.session import Session

    budget.tune_allocator(arenas=arenas)
    torch.set_num_threads(1)
    model = TransformerXL.from_pretrained(str(BUNDLED))
    text = balcony()
    warm = Session(model, mem_len=64)
    warm.start(text[:200]), warm.step()
    sessions = [Session(model, mem_len=mem_len, temperature=1.0, seed=i) for i in range(2)]

    def both(work) -> float:
        threads = [threading.Thread(target=work, args=(s,)) for s in sessions]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    feed = both(lambda s: s.start(text))
    stepping = both(lambda s: [s.step() for _ in range(steps)])
    return dict(feed_ms_per_char=feed * 1e3 / len(text), step_ms=stepping * 1e3 / steps)


def compare_arenas(repeats: int) -> dict:
    """arenas_child with 1 and 2 arenas, fresh processes alternating; medians."""
    import statistics
    import subprocess

    runs: dict[int, list[dict]] = {1: [], 2: []}
    for r in range(repeats):
        for arenas in runs:
            out = subprocess.run(
                [sys.executable, __file__, "--arenas-child", str(arenas)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[arenas].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"[{r + 1}/{repeats}] {arenas} arena(s): {runs[arenas][-1]}", flush=True)
    report = {}
    for arenas, results in runs.items():
        report[f"{arenas} arena(s)"] = {
            key: round(statistics.median(run[key] for run in results), 3) for key in results[0]
        }
    base = report["2 arena(s)"]
    report["1 arena / 2 arenas"] = {
        key: round(report["1 arena(s)"][key] / base[key], 3) for key in base
    }
    print(json.dumps(report, indent=2))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-session", action="store_true")
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--warm", type=int, default=0, help="--per-session: sessions first")
    parser.add_argument("--clients", type=int, default=1, help="--per-session: at once")
    parser.add_argument("--mem-len", type=int, default=128)
    parser.add_argument("--prompt-chars", type=int, default=600, help="soak prompts")
    parser.add_argument("--rounds", type=int, default=4, help="soak rounds after the fill")
    parser.add_argument("--threads", type=int, default=8, help="soak clients at once")
    parser.add_argument("--budget-mb", type=float, default=100)
    parser.add_argument("--model", default=str(BUNDLED))
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose app.py runs")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the app")
    parser.add_argument("--check", action="store_true", help="compare with each session alone")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--arenas", action="store_true", help="1 malloc arena vs 2: speed")
    parser.add_argument("--repeats", type=int, default=3, help="--arenas: runs of each")
    parser.add_argument("--arenas-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arenas_child:
        print(json.dumps(arenas_child(args.arenas_child)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="txl-soak-"))
    if args.arenas:
        report = compare_arenas(args.repeats)
    elif args.per_session:
        report = per_session(args, args.model, tmp / "app.log")
        print(json.dumps(report, indent=2))
    else:
        report = run_soak(args, tmp)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


def run_soak(args, tmp: Path) -> dict:
    offload_tmp = tmp / "tmp"
    offload_tmp.mkdir()
    env = dict(
        TXL_MEMORY_BUDGET_MB=args.budget_mb,
        TXL_SESSION_TTL=3600,
        TXL_MAX_SESSIONS=max(200, 2 * args.sessions),
        TXL_CONCURRENCY=4,
        TMPDIR=offload_tmp,
    )
    env.update(dict(kv.split("=", 1) for kv in args.env))
    proc, url = start_app(
        args.model, app_dir=Path(args.root), extra_env=env, log=tmp / "app.log"
    )
    try:
        text = balcony()
        with httpx.Client(timeout=600) as client:  # warm-up: two sessions, two Steps
            for plan in plans(2, args.prompt_chars, args.mem_len, text[::-1]):
                step(url, plan, client), step(url, plan, client)
        time.sleep(1)
        baseline = rss_mb(proc.pid)
        sessions = plans(args.sessions, args.prompt_chars, args.mem_len, text)
        watch = RSSWatch(proc.pid)
        t0 = time.perf_counter()
        result = soak(url, sessions, args.rounds, args.threads)
        wall = time.perf_counter() - t0
        samples = watch.stop()
        files = len(list(offload_tmp.glob("txl-offload-*/*.safetensors")))
    finally:
        stop_app(proc)
    if result["errors"]:
        raise SystemExit(f"{len(result['errors'])} errors, the first: {result['errors'][0]}")
    peak = max(mb for _, mb in samples)
    restores = result["restores_ms"]
    report = dict(
        sessions=args.sessions,
        steps=sum(len(t) for t in result["texts"].values()),
        mem_len=args.mem_len,
        wall_s=round(wall, 1),
        budget_mb=args.budget_mb,
        baseline_mb=round(baseline, 1),
        peak_rss_mb=round(peak, 1),
        limit_mb=round(1.1 * (baseline + args.budget_mb), 1),
        unbudgeted_kv_mb=round(args.sessions * kv_bytes(args.model, args.mem_len) / 2**20, 1),
        restores=len(restores),
        restore_p50_ms=percentile(restores, 50),
        restore_p95_ms=percentile(restores, 95),
        files_left_at_the_end=files,
        rss_over_time=[
            (round(t, 1), round(mb, 1)) for t, mb in samples[:: max(1, len(samples) // 40)]
        ],
    )
    if args.check:
        same = sum(
            result["texts"][p["hash"]] == alone(args.model, p, result["steps"]) for p in sessions
        )
        report["identical_to_alone"] = same
    print(json.dumps({k: v for k, v in report.items() if k != "rss_over_time"}, indent=2))
    print("RSS over time (s, MB):", report["rss_over_time"])
    return report


if __name__ == "__main__":
    main()
