"""Serving benchmark of the app: N concurrent gradio_client sessions, each Stepping.

Every Step returns the full views (coloured text, heatmap, memory-share bars), as the
browser gets them. Reported per Step:

- server: the handler's own time (Session.step + every figure), from the step summary's
  ``handler_ms`` — the goal is p95 <= 150 ms;
- round trip: what the client waits, queueing behind the other sessions included.

    python benchmarks/bench_app.py                         # 16 sessions x 40 steps
    python benchmarks/bench_app.py --clients 2 --steps 5   # a smoke run
    python benchmarks/bench_app.py --url http://127.0.0.1:7860/   # an app already running
    python benchmarks/bench_app.py --model tiny --steps 30 --check  # tests/test_concurrency.py
    python benchmarks/bench_app.py --app-dir ../wt-before   # another checkout's app.py
    python benchmarks/bench_app.py --steps 30 --baseline-dir ../wt-before  # both, one run

Without --url the app is started as a subprocess (python app.py) on a free port, with
--model (default: weights/shakespeare-char when present, else a random model of the same
shape made in a temporary folder; ``tiny``: the 2-layer random model of the tests). Each
session has its own prompt and seed, and first generates --fill characters so that its
memory is full (mem_len keys per Step). --app-dir runs another checkout's app.py (its own
txl package, this interpreter), to compare versions on the same machine in the same run.
--check first runs every session alone, one after
the other, and then checks that each session's text under load is the same (no cross-talk).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "weights" / "shakespeare-char"
GOAL_P95_MS = 150.0
NAMES = [
    "ROMEO", "JULIET", "MERCUTIO", "TYBALT", "NURSE", "FRIAR", "CAPULET", "BENVOLIO",
    "PARIS", "PRINCE", "SAMPSON", "GREGORY", "ABRAHAM", "BALTHASAR", "PETER", "MONTAGUE",
]  # fmt: skip
VOCAB = sorted(set("\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
TINY = dict(d_model=32, n_layer=2, n_head=2, d_head=8, d_inner=64, tgt_len=16, mem_len=32)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def random_model(folder: Path, shape: dict | None = None) -> str:
    """A random model with the shape of configs/shakespeare-char.json (or ``shape``)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from txl import TransformerXL, TXLConfig

    if shape is None:
        shape = json.loads((ROOT / "configs" / "shakespeare-char.json").read_text())
    keys = ("d_model", "n_layer", "n_head", "d_head", "d_inner", "tgt_len", "mem_len")
    torch.manual_seed(0)
    config = TXLConfig(vocab=VOCAB, dropout=0.0, **{k: shape[k] for k in keys})
    TransformerXL(config).save_pretrained(folder)
    return str(folder)


START_TIMEOUT_S = 480


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(
    model: str,
    concurrency: int | None = None,
    app_dir: Path = ROOT,
    extra_env: dict | None = None,
    log: Path | None = None,
    tries: int = 3,
) -> tuple[subprocess.Popen, str]:
    """``python app.py`` of ``app_dir`` on a free port; returns (process, url) once
    launch() has served and checked the page. The app's output goes to ``log`` (a
    temporary file when None): a pipe nobody reads would block it once full.

    Gradio's launch() gives up when its own request to the page takes more than 3 s
    ("When localhost is not accessible..."), which happens on a machine busy with other
    work: then the app is started again, up to ``tries`` times."""
    env = {} if concurrency is None else {"TXL_CONCURRENCY": concurrency}
    env.update(extra_env or {})
    if log is None:
        handle, name = tempfile.mkstemp(prefix="txl-app-", suffix=".log")
        os.close(handle)
        log = Path(name)
    for attempt in range(tries):
        try:
            return _start_app(model, env, Path(log), Path(app_dir))
        except RuntimeError as e:
            if "localhost is not accessible" not in str(e) or attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _start_app(model: str, env: dict, log: Path, app_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(
        os.environ,
        TXL_MODEL=str(model),
        GRADIO_SERVER_NAME="127.0.0.1",
        GRADIO_SERVER_PORT=str(port),
        PYTHONUNBUFFERED="1",  # the banner reaches the log as it is printed
        **{k: str(v) for k, v in env.items()},
    )
    out = open(log, "w")  # noqa: SIM115 (the process writes to it until it ends)
    proc = subprocess.Popen(
        [sys.executable, str(app_dir / "app.py")], cwd=app_dir, env=env, stdout=out, stderr=out
    )
    # Patient: a loaded 2-core machine took over 180 s to import torch and Gradio and build
    # the page; a hang is stopped here, or by pytest-timeout in the tests.
    deadline = time.monotonic() + START_TIMEOUT_S
    # The port answers before launch() has checked the page; this line comes after it.
    while "To create a public link" not in log.read_text():
        if proc.poll() is not None:
            raise RuntimeError(f"the app exited:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            stop_app(proc)
            raise RuntimeError(f"the app did not start within {START_TIMEOUT_S} s")
        time.sleep(0.3)
    return proc, f"http://127.0.0.1:{port}/"


def stop_app(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def api_client(url: str, timeout: float):
    """A gradio_client Client for benchmarks and tests. ssl_verify=False: gradio_client
    otherwise builds an SSL context (reads the CA bundle) for every request, 4x the CPU of
    the app's own work, on the same cores. timeout (s, per HTTP request): httpx's default
    of 5 s fails a request on a loaded machine where the app is only slow."""
    from gradio_client import Client

    return Client(
        url,
        verbose=False,
        analytics_enabled=False,
        download_files=False,
        ssl_verify=False,
        httpx_kwargs={"timeout": timeout},
    )


def run_session(
    url: str, steps: int, fill: int, seed: int, results: dict, barrier, texts: dict
) -> None:
    """Session `seed`: its own prompt and seed; Generate `fill` characters, then Step."""
    client = api_client(url, timeout=120)
    prompt = f"{NAMES[seed % len(NAMES)]}:\n"
    settings = dict(memory=True, temperature=0.8, top_k=0, top_p=1.0, seed=seed)
    try:
        seen = [client.predict(prompt=prompt, n_tokens=fill, **settings, api_name="/generate")[0]]
        if barrier is not None:
            barrier.wait()
        for _ in range(steps):
            t0 = time.perf_counter()
            out = client.predict(prompt=prompt, **settings, api_name="/step")
            results["round_trip"].append((time.perf_counter() - t0) * 1e3)
            summary = out[5]
            results["server"].append(summary["handler_ms"])
            results["model"].append(summary["latency_ms"])
            results["keys"].append(summary["n_keys"])
            seen.append(out[0])
        texts[seed] = seen
    finally:
        client.close()


RESULTS = ("server", "round_trip", "model", "keys")


def measure(url: str, args) -> dict:
    """args.clients sessions Stepping at once against the app at url: the report."""
    alone: dict[int, list[str]] = {}
    if args.check:  # every session by itself first: the texts to expect under load
        for i in range(args.clients):
            run_session(url, args.steps, args.fill, i, {k: [] for k in RESULTS}, None, alone)
    results = {k: [] for k in RESULTS}
    texts: dict[int, list[str]] = {}
    stepping = []  # when the sessions start Stepping (their Generate done): the barrier
    barrier = threading.Barrier(args.clients, action=lambda: stepping.append(time.perf_counter()))
    threads = [
        threading.Thread(
            target=run_session, args=(url, args.steps, args.fill, i, results, barrier, texts)
        )
        for i in range(args.clients)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.perf_counter()
    n = len(results["server"])
    if n != args.clients * args.steps:
        raise SystemExit(f"only {n} of {args.clients * args.steps} steps completed")
    report = {
        "clients": args.clients,
        "steps": n,
        "wall_s": round(end - t0, 2),
        # Steps served per second while all sessions Step (after their Generate).
        "steps_per_s": round(n / (end - stepping[0]), 2),
        "keys_per_step": statistics.median(results["keys"]),
    }
    for name in ("server", "round_trip", "model"):
        values = results[name]
        report[name] = {
            "p50_ms": round(percentile(values, 50), 1),
            "p95_ms": round(percentile(values, 95), 1),
            "max_ms": round(max(values), 1),
        }
    if args.check:
        same = sum(texts.get(i) == alone.get(i) for i in range(args.clients))
        report["sessions_identical_to_alone"] = same
    return report


def print_report(label: str, report: dict, args) -> None:
    print(
        f"{label}: {report['clients']} sessions x {args.steps} Steps "
        f"({report['keys_per_step']:.0f} keys each), {report['wall_s']:.1f} s wall, "
        f"{report['steps_per_s']:.1f} Steps/s served"
    )
    for name, title in (
        ("server", "server (handler)"),
        ("round_trip", "round trip"),
        ("model", "model call"),
    ):
        r = report[name]
        print(
            f"  {title:17s} p50 {r['p50_ms']:7.1f} ms   p95 {r['p95_ms']:7.1f} ms"
            f"   max {r['max_ms']:7.1f} ms"
        )
    ok = report["server"]["p95_ms"] <= GOAL_P95_MS
    print(f"  goal: server p95 <= {GOAL_P95_MS:.0f} ms: {'met' if ok else 'NOT met'}")
    if "sessions_identical_to_alone" in report:
        same = report["sessions_identical_to_alone"]
        print(f"  isolation: {same}/{args.clients} sessions identical to the same session alone")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40, help="Steps per session")
    parser.add_argument("--fill", type=int, default=130, help="characters generated first")
    parser.add_argument("--url", help="benchmark an app that is already running")
    parser.add_argument("--model", help="model folder or Hub id for the app started here")
    parser.add_argument("--concurrency", type=int, help="TXL_CONCURRENCY of the app started here")
    parser.add_argument(
        "--app-dir", type=Path, default=ROOT, help="the checkout whose app.py is started"
    )
    parser.add_argument(
        "--baseline-dir",
        type=Path,
        help="another checkout, measured in the same run right after --app-dir's app",
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--check",
        action="store_true",
        help="run every session alone first; check each is the same under load",
    )
    args = parser.parse_args()

    tmp = None
    model = args.model
    if args.url is None:
        if model is None and (BUNDLED / "model.safetensors").exists():
            model = str(BUNDLED)
        if model is None or model == "tiny":
            tmp = tempfile.TemporaryDirectory(prefix="txl-bench-")
            if model == "tiny":
                model = random_model(Path(tmp.name) / "tiny", TINY)
            else:
                model = random_model(Path(tmp.name) / "random")
                print(f"no trained weights: a random model of the same shape ({model})")
    apps = [("after" if args.baseline_dir else "app", args.app_dir)]
    if args.baseline_dir:
        apps.append(("before", args.baseline_dir))
    load_before = os.getloadavg()
    reports = {}
    try:
        for label, app_dir in apps:
            proc, url = None, args.url
            if url is None:
                proc, url = start_app(model, args.concurrency, app_dir.resolve())
                print(f"{label}: app of {app_dir} started at {url} with {model}", flush=True)
            try:
                reports[label] = measure(url, args)
            finally:
                if proc is not None:
                    stop_app(proc)
    finally:
        if tmp is not None:
            tmp.cleanup()
    load_after = os.getloadavg()
    for label, report in reports.items():
        print_report(label, report, args)
    if args.baseline_dir:
        a, b = reports["after"], reports["before"]
        print(
            f"before / after: Steps/s {b['steps_per_s'] / a['steps_per_s']:.2f}x, "
            f"handler p50 {b['server']['p50_ms'] / a['server']['p50_ms']:.2f}x, "
            f"round trip p95 {b['round_trip']['p95_ms'] / a['round_trip']['p95_ms']:.2f}x"
        )
    print(f"load average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end")
    for label, report in reports.items():
        if report.get("sessions_identical_to_alone", args.clients) != args.clients:
            raise SystemExit(f"{label}: cross-talk: a session's text changed under load")
    if args.json:
        out = reports if args.baseline_dir else reports["app"]
        if args.baseline_dir:
            out = dict(out, load_average=[round(load_before[0], 2), round(load_after[0], 2)])
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
