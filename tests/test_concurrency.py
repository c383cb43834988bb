"""Many users at once (issue 6): sessions do not leak into each other, and the memory of
expired sessions goes back to the operating system.

- 16 gradio_client sessions x (1 Generate + 30 Steps) at the same time, each with its own
  prompt, seed and settings, give exactly the texts each session gives when it runs alone.
- A server (``python app.py`` in a subprocess) serves 200 sessions that each fill a few
  MB of Transformer-XL memory; once they have expired (TXL_SESSION_TTL, and the
  TXL_MAX_SESSIONS cap) its resident memory is back within 10 % of where it started.

Latency under this load is measured by ``benchmarks/bench_app.py --tiny --steps 30``
(speed claims live in benchmarks, not in tests).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import app  # noqa: E402
from benchmarks.bench_app import start_app, stop_app  # noqa: E402
from tests.raw_api import call  # noqa: E402
from tests.test_app import MEM_LEN, VOCAB, new_client, serve, tiny_model  # noqa: E402
from txl import TransformerXL, TXLConfig  # noqa: E402

N_CLIENTS, N_STEPS = 16, 30
NAMES = [
    "ROMEO", "JULIET", "MERCUTIO", "TYBALT", "NURSE", "FRIAR", "CAPULET", "BENVOLIO",
    "PARIS", "PRINCE", "SAMPSON", "GREGORY", "ABRAHAM", "BALTHASAR", "PETER", "MONTAGUE",
]  # fmt: skip


def plan(i: int) -> dict:
    """Client i's prompt and settings: every combination of memory, mem_len, temperature
    (greedy included), top-k and top-p occurs, and every seed differs."""
    return dict(
        prompt=f"{NAMES[i]}:\n",
        n_tokens=10 + i,
        memory=i % 5 != 4,
        mem_len=[MEM_LEN, 8, 0, 20][i % 4],
        temperature=[1.0, 0.8, 1.3, 0.0][(i // 2) % 4],
        top_k=[0, 5][(i // 4) % 2],
        top_p=[1.0, 0.9][i // 8],
        seed=100 + i,
    )


def memory_at(i: int, k: int, memory: bool) -> bool:
    """Every third client switches its memory over at step 15 (a rebuild mid-session)."""
    return (not memory) if i % 3 == 0 and k >= 15 else memory


def run_remote(url: str, i: int, barrier: threading.Barrier, out: dict) -> None:
    p = plan(i)
    client = new_client(url)
    try:
        settings = {k: p[k] for k in ("memory", "mem_len", "temperature", "top_k", "top_p")}
        barrier.wait(timeout=300)
        texts = [
            client.predict(
                prompt=p["prompt"],
                n_tokens=p["n_tokens"],
                seed=p["seed"],
                **settings,
                api_name="/generate",
            )[0]
        ]
        views = []
        for k in range(N_STEPS):
            settings["memory"] = memory_at(i, k, p["memory"])
            step = client.predict(prompt=p["prompt"], seed=p["seed"], **settings, api_name="/step")
            texts.append(step[0])
            views.append(attention_keys(step[3]))
        out[i] = texts, views
    except BaseException as e:  # reported by the test
        out[i] = e
    finally:
        client.close()


def attention_keys(view: dict) -> tuple:
    """What an attention view says about whose step it is: the query's position, its
    keys, and its rows of weights."""
    return view["pos"], view["first"], view["last"], view["w"]


def run_alone(txl_app: app.Demo, i: int) -> tuple[list[str], list[tuple]]:
    """The same session through the same handlers, with nothing else running."""
    p = plan(i)
    args = [p[k] for k in ("memory", "mem_len", "temperature", "top_k", "top_p", "seed")]
    watch = txl_app.watch
    *_, state = list(watch.generate(p["prompt"], p["n_tokens"], *args, None, None, None))[-1]
    texts, views = [state.session.text], []
    for k in range(N_STEPS):
        args[0] = memory_at(i, k, p["memory"])
        _, _, _, attention, *_, state = txl_app.watch.step(p["prompt"], *args, None, None, state)
        texts.append(state.session.text)
        views.append(attention_keys(attention))
    return texts, views


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    txl_app = app.Demo.serving(folder, model_dirs=[])
    demo, url = serve(txl_app)
    yield url, txl_app
    demo.close()


def test_16_concurrent_sessions_equal_the_same_sessions_alone(server):
    url, txl_app = server
    out: dict[int, list[str] | BaseException] = {}
    barrier = threading.Barrier(N_CLIENTS)
    threads = [
        threading.Thread(target=run_remote, args=(url, i, barrier, out)) for i in range(N_CLIENTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    errors = {i: r for i, r in out.items() if isinstance(r, BaseException)}
    assert not errors and len(out) == N_CLIENTS, errors
    for i in range(N_CLIENTS):
        alone, alone_views = run_alone(txl_app, i)
        texts, views = out[i]
        assert texts == alone, f"session {i} differs from the same session run alone"
        p = plan(i)
        assert alone[0].startswith(p["prompt"]) and len(alone[0]) == len(p["prompt"]) + 10 + i
        assert all(b[:-1] == a for a, b in zip(alone, alone[1:]))  # one char per Step
        # each Step's attention view is of that session's newest character
        assert [pos for pos, *_ in views] == [len(t) - 1 for t in alone[1:]]
        for (pos, first, last, w), (pos_a, first_a, last_a, w_a) in zip(views, alone_views):
            assert (pos, first, last) == (pos_a, first_a, last_a)
            np.testing.assert_allclose(w, w_a, atol=1e-3)
    assert len({texts[-1] for texts, _ in out.values()}) == N_CLIENTS


# ---- memory after sessions expire -------------------------------------------------------

N_SESSIONS, N_WARM, CAP, TTL = 200, 50, 100, 8
# 8 heads x 64 per head in 4 layers: 16 KB of memory per position, ~4 MB per session
# (its key/value buffers grow to 260 positions), with little compute per token.
MEMORY_MODEL = dict(
    d_model=16, n_layer=4, n_head=8, d_head=64, d_inner=32, tgt_len=64, mem_len=128, dropout=0.0
)
PROMPT = ("ROMEO:\nBut soft! what light through yonder window breaks? " * 3)[:130]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


@pytest.fixture
def app_process(tmp_path):
    """python app.py on a free port, TTL and cap small, the memory-heavy model."""
    torch.manual_seed(0)
    model = tmp_path / "model"
    TransformerXL(TXLConfig(vocab=VOCAB, **MEMORY_MODEL)).save_pretrained(model)
    env = dict(TXL_SESSION_TTL=TTL, TXL_MAX_SESSIONS=CAP, TXL_CONCURRENCY=4)
    # start_app waits for launch() to finish its own check of the page, and starts the
    # app again when that check timed out on a busy machine (the app then exits).
    proc, url = start_app(str(model), extra_env=env, log=tmp_path / "app.log")
    try:
        yield proc, url
    finally:
        stop_app(proc)


def sessions(url: str, n: int, threads: int = 8) -> None:
    """n sessions, each a Generate of one character after a 130-character prompt (so
    131 positions of memory, in buffers of 260)."""

    def work(part: list[int], errors: list) -> None:
        with httpx.Client(timeout=300) as client:
            for i in part:
                data = [PROMPT, 1, True, 128, 0.8, 0, 1.0, i, None, None]
                try:
                    ok, result = call(url, "generate", data, uuid.uuid4().hex, client)
                    assert ok and result[0].startswith(PROMPT[:20]), result
                except BaseException as e:
                    errors.append(e)

    errors: list = []
    workers = [
        threading.Thread(target=work, args=(list(range(t, n, threads)), errors))
        for t in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors[:3]


def settle(pid: int, at_most: float | None = None, patience: float = 300) -> float:
    """RSS once the sessions have expired (TXL_SESSION_TTL after their last request) and
    been swept: the first reading at or below ``at_most`` once TTL has passed, or, when
    none comes within ``patience`` seconds (a slow sweep on a loaded machine only takes
    longer), the last reading. None: the reading just after TTL and a sweep."""
    time.sleep(TTL + 2)  # before TTL no session can have expired: nothing to look at
    deadline = time.monotonic() + patience
    rss = rss_mb(pid)
    while at_most is not None and rss > at_most and time.monotonic() < deadline:
        time.sleep(0.5)
        rss = rss_mb(pid)
    return rss


def test_memory_returns_after_200_sessions_expire(app_process):
    proc, url = app_process
    sessions(url, N_WARM)  # the allocator, Gradio's caches and its per-session records warm
    before = settle(proc.pid)

    peak = [0.0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], rss_mb(proc.pid))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        sessions(url, N_SESSIONS)
    finally:
        done.set()
        watcher.join()
    after = settle(proc.pid, at_most=1.10 * before)
    print(f"RSS before {before:.0f} MB, peak {peak[0]:.0f} MB, after {after:.0f} MB")
    assert peak[0] > before + 100, "the sessions should have held memory"
    assert after <= 1.10 * before, f"RSS {after:.0f} MB after expiry, {before:.0f} MB before"
