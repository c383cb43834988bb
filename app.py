"""See what Transformer-XL's recurrent memory does: a Gradio app.

    python app.py                      # http://127.0.0.1:7860, the bundled model
    TXL_MODEL=org/name python app.py   # a Hub repo id (or another folder)

This file composes the page: it builds the one service the tabs share (webapp/serve.py:
the models, the visitors' states, the memory budget, the long work), hands it to each tab
(webapp/tabs/: a tab's layout, handlers and events live in its own module), and launches.
docs/architecture.md is the map.

Environment: TXL_MODEL (model to load first), GRADIO_SERVER_NAME / GRADIO_SERVER_PORT,
TXL_CONCURRENCY (events run at once, default 4), TXL_MAX_SESSIONS (browser sessions kept,
default 200), TXL_SESSION_TTL (seconds a session lives after its last use, default 3600),
TXL_MAX_PARAMS (largest model the Load box accepts, default 400M parameters: the
WikiText-103 model has 285M), TXL_DTYPE (float32, bfloat16, or auto: bfloat16 for models
over 100M parameters, the default), TXL_SESSION_MEMORY_MB (the most memory one session's
Transformer-XL memory may take, default 256: it caps mem_len for big models),
TXL_MEMORY_BUDGET_MB (all sessions' memories together, default half the machine's memory:
beyond it idle sessions' memories wait on disk), TXL_OFFLOAD_DISK_MB (the disk they may
take, default half the free space of the temporary folder's disk),
TXL_TORCH_THREADS (torch threads per model call, default 1), TXL_MODEL_DIRS (folders,
separated by os.pathsep, besides the app's own, that the Load box may read models from),
OMP_WAIT_POLICY (PASSIVE unless set: see below).
"""

from __future__ import annotations

import os

# Before gradio / huggingface_hub are imported: no analytics, no telemetry.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Gradio recomputes a pandas summary of its last 10,000 events after every event, for its
# monitoring page: 20 ms of CPU per event once that many ran (a Step costs less). Every
# 100 events is plenty.
os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "100")
# Before torch is imported (OpenMP reads it once, as it loads): OpenMP's idle threads sleep
# at once instead of spinning. A Score's chunks run with two torch threads, and after each
# parallel op the team's other thread spun on, taking a core from the two windows the
# Score runs side by side and from other visitors' Steps: /score 2,000 characters 11.33 s
# against 12.39 (medians of 4, the same checkout's app with and without it, in turn;
# docs/performance.md). Steps run on one thread, where OpenMP has no team to idle.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import inspect  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import gradio as gr  # noqa: E402
import torch  # noqa: E402

from webapp.inputs import name_input_errors  # noqa: E402
from webapp.serve import ROOT, DemoService, env_int  # noqa: E402
from webapp.tabs.anatomy import AnatomyTab  # noqa: E402
from webapp.tabs.examples import EXAMPLES  # noqa: E402
from webapp.tabs.memory_pair import MemoryPairTab  # noqa: E402
from webapp.tabs.recall import RecallTab  # noqa: E402
from webapp.tabs.score import ScoreTab  # noqa: E402
from webapp.tabs.watch import WatchTab  # noqa: E402

WEB = ROOT / "webapp" / "web"
# views.js first (it defines window.TXL); each other file adds its own views to TXL.
# Put in the page's <head> once, by launch() beside the CSS, for every view that mounts.
WEB_SCRIPTS = [WEB / "views.js"] + sorted(p for p in WEB.glob("*.js") if p.name != "views.js")
VIEWS_HEAD = "".join(f"<script>{p.read_text()}</script>" for p in WEB_SCRIPTS)


class Demo:
    """The page's parts: the shared service, and one object per tab that holds it (the
    tab's handlers). ``build`` lays the tabs out and wires them."""

    def __init__(self, service: DemoService):
        self.service = service
        self.watch = WatchTab(service)
        self.score = ScoreTab(service)
        self.recall = RecallTab(service)
        self.anatomy = AnatomyTab(service)
        self.memory_pair = MemoryPairTab(service)

    @classmethod
    def serving(cls, *args, **kwargs) -> Demo:
        """A Demo on a new DemoService (``DemoService``'s arguments: the default model's
        source, model_dirs, a budget...)."""
        return cls(DemoService(*args, **kwargs))

    def build(self) -> gr.Blocks:
        """The page: a header and five tabs, each laid out, then wired (a tab's events may
        reach another tab's components: Watch it, the Load box's mem_len)."""
        visitors = self.service.visitors
        with gr.Blocks(title="Transformer-XL memory", delete_cache=(600, 3600)) as demo:
            state = gr.State(None, time_to_live=visitors.ttl, delete_callback=visitors.release)
            gr.Markdown(HEADER, elem_id="header")
            with gr.Tabs(elem_id="tabs") as tabs:
                with gr.Tab("Watch the memory", id="watch"):
                    ui = self.watch.build()
                with gr.Tab("Does memory help?", id="score"):
                    ui.update(self.score.build())
                with gr.Tab("How far back can it recall?", id="recall"):
                    ui.update(self.recall.build())
                with gr.Tab("Inside the attention", id="anatomy"):
                    ui.update(self.anatomy.build(EXAMPLES))
                with gr.Tab("Memory on | off", id="memory_pair"):
                    ui.update(self.memory_pair.build())
            ui["tabs"] = tabs  # Watch it (the Score and Recall tabs) switches to the Watch tab
            for tab in (self.watch, self.score, self.recall, self.anatomy, self.memory_pair):
                tab.wire(ui, state)
            # Every number and checkbox refuses a bad value by its API name.
            api_names = {"score_mem": "mem_len", "anatomy_mem": "mem_len", "recall_mem": "mem_len"}
            api_names.update({k: k.removeprefix("pair_") for k in ui if k.startswith("pair_")})
            name_input_errors((api_names.get(k, k), c) for k, c in ui.items())
        return demo


def launch(demo: gr.Blocks, **kwargs):
    """queue + launch with the app's limits; keyword arguments override launch()'s."""
    options = dict(
        server_name=os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1",
        server_port=env_int("GRADIO_SERVER_PORT", 7860),
        state_session_capacity=env_int("TXL_MAX_SESSIONS", 200),
        css=CSS,
        head=VIEWS_HEAD,
        footer_links=["api"],
        # Gradio 6 records every event's inputs and outputs in the page's localStorage (up
        # to 100 runs, the whole list rewritten as JSON on each status update): a cost in
        # every Step that grows with the text, and visitors' texts kept in their browser.
        run_history=False,
    )
    # Gradio's launch() checks its own page with a 3-second timeout and exits ("When
    # localhost is not accessible...") when the check is slow, which a busy machine (a
    # Space starting beside others, a test run beside a CPU burner) makes it: the server
    # is up and would have answered. Its private _frontend flag only gates that check.
    if "_frontend" in inspect.signature(demo.launch).parameters:
        options["_frontend"] = False
    options.update(kwargs)
    demo.queue(max_size=128, default_concurrency_limit=env_int("TXL_CONCURRENCY", 4))
    return demo.launch(**options)


HEADER = """\
# Transformer-XL: watch the memory
Transformer-XL keeps the hidden states of the last `mem_len` tokens as a **memory** and lets \
each new token attend to them as well as to its own segment, so it sees past the segment \
without recomputing anything. Generate or Step, then see what the newest character looks at, \
and which text has already fallen out of memory.
"""

CSS = (
    "".join(p.read_text() for p in sorted(WEB.glob("*.css")))
    + """
@media (max-width: 720px) {
  #main-row { flex-direction: column; }
  #main-row > div { min-width: 0 !important; width: 100%; }
  #main-row .row > div, #main-row .row > button { min-width: 0 !important; }
}
"""
)


def main() -> None:
    # One thread per model call: events run concurrently, and a step's ops are far too
    # small to split (two threads on busy cores made a step 20x slower in benchmarks).
    torch.set_num_threads(env_int("TXL_TORCH_THREADS", 1))
    # SIGTERM (how a Space or a supervisor stops the app) ends it like Ctrl-C, so that the
    # folder of offloaded memories is removed on the way out (webapp.budget.MemoryBudget).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    service = DemoService()
    for problem in (service.load_error, service.load_notice):
        if problem:
            print(f"warning: {problem}")
    launch(Demo(service).build())


if __name__ == "__main__":
    main()
