"""See what Transformer-XL's recurrent memory does: a Gradio app.

    python app.py                      # http://127.0.0.1:7860, the bundled model
    TXL_MODEL=org/name python app.py   # a Hub repo id (or another folder)

This file only builds the page and wires events: the text, memory and sampling live in
``txl.session.Session`` (one per browser session, in ``gr.State``), the figures in
``webapp.viz``. The model itself is loaded once per source and shared read-only.

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
separated by os.pathsep, besides the app's own, that the Load box may read models from).
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

import inspect  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gradio as gr  # noqa: E402
import torch  # noqa: E402

from txl import TXLConfig  # noqa: E402
from txl.hub import TXLLoadError  # noqa: E402
from txl.session import Session  # noqa: E402
from webapp import anatomy_viz, viz  # noqa: E402
from webapp.play import PlayControl, as_play_id, play_stream, visitor_of  # noqa: E402
from webapp.serve import (  # noqa: E402
    HISTORY_STEPS,
    MAX_MEM_LEN,
    ROOT,
    Server,
    UserState,
    allowed_folder,
    as_int,
    display_source,
    env_int,
    model_markdown,
    name_input_errors,
    parse_choice,
    resolve_source,
    user_errors,
)
from webapp.tabs import anatomy as anatomy_tab  # noqa: E402
from webapp.tabs import moments as moments_tab  # noqa: E402
from webapp.tabs import recall as recall_tab  # noqa: E402
from webapp.tabs import score as score_tab  # noqa: E402
from webapp.tabs.examples import EXAMPLES  # noqa: E402

MAX_NEW_TOKENS = 500  # per Generate call
MAX_SOURCE_CHARS = 256  # the Load box: a Hub id is at most 96 + 1 + 96 characters
STREAM_EVERY_S = 0.08  # Generate sends the text at most this often
HEATMAP_COLUMNS = 160  # more keys than this are summed into buckets (mem_len 128 + 1 fits)
ALL_LAYERS, MEAN_HEADS = "all layers", "mean over heads"

BUTTONS = [
    ("generate", "primary"),
    ("continue", "secondary"),
    ("step", "secondary"),
    ("play", "secondary"),
    ("reset", "stop"),
]
EMPTY_HEATMAP = "Step or Generate to see where the newest token looks."
# The two per-step views: gr.HTML whose value is a dict (webapp.viz.text_view /
# attention_view) drawn by webapp/web/views.js. The templates do not depend on the value,
# so Gradio leaves their DOM alone and only the watch() callbacks redraw.
WEB = ROOT / "webapp" / "web"
# views.js first (it defines window.TXL); each other file adds its own views to TXL.
# Put in the page's <head> once, by launch() beside the CSS, for every view that mounts.
WEB_SCRIPTS = [WEB / "views.js"] + sorted(p for p in WEB.glob("*.js") if p.name != "views.js")
VIEWS_HEAD = "".join(f"<script>{p.read_text()}</script>" for p in WEB_SCRIPTS)
ATTENTION_TEMPLATE = (
    '<div class="txl-att"><div class="txl-att-bar"><button class="txl-png" type="button" '
    'title="Save this view as PNG">⤓ PNG</button></div>'
    f'<div class="txl-empty">{EMPTY_HEATMAP}</div>'
    '<canvas></canvas><div class="txl-tip"></div></div><div class="txl-terms"></div>'
)
PREDICTIONS_TEMPLATE = (
    '<div class="txl-pred"><div class="txl-empty">Step or Generate to see the next-token '
    'prediction with and without memory.</div><div class="txl-pred-body"></div></div>'
)
SUMMARY_TEMPLATE = '<pre class="txl-summary"></pre>'
STATUS_TEMPLATE = '<div class="txl-status"></div>'
TEXT_TEMPLATE = (
    '<div class="txl-textview"><div class="txl-legend"></div><div class="txl-text"></div>'
    '<div class="txl-tip"></div></div>'
)


class TXLApp(Server):
    """The page and its handlers (small: they call Session and webapp.viz)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plays = PlayControl()  # every visitor's Play and Pause

    # -- views --

    def text_views(self, s: Session, layer=None, head=None) -> tuple[str, dict, str]:
        """(plain text, the text view's data, status line) of the session now: each
        character shaded by the newest token's attention when the last step is fresh."""
        info = s.memory_info()
        t, n = s.last_trace, len(s.ids)
        fresh = (
            t is not None
            and t.position == n - 1
            and t.memory == info["memory"]
            and t.memory_tokens == info["tokens"]
        )
        window = s.seg_len  # what a model without memory sees: the window line
        roles = (
            viz.roles_from_trace(n, t, window) if fresh else viz.roles_from_info(n, info, window)
        )
        layer, head = self.view_choice(s, layer, head)
        unit = s.tokenizer.unit
        shaded = t if fresh and t.attentions is not None else None
        effect = s.memory_effect
        view = viz.text_view(
            s.pieces,
            roles,
            shaded,
            layer,
            head,
            info["memory"],
            unit=unit,
            effect=effect,
            window=window,
        )
        latency = t.latency_ms if fresh else None
        share = viz.beyond_window_share(shaded, window, layer, head)
        beyond = None if share is None else (share, window, viz.choice_words(layer, head))
        status = viz.status_markdown(
            info, n, latency, unit=unit, saved=effect.bits_saved(), beyond=beyond
        )
        return s.text, view, status

    @staticmethod
    def view_choice(s: Session, layer, head) -> tuple[int | None, int | None]:
        c = s.model.config
        return parse_choice(layer, "layer", c.n_layer), parse_choice(head, "head", c.n_head)

    def attention_views(self, state: UserState, layer, head):
        """(attention view's data, step summary) of the last step."""
        s, t = state.session, state.session.last_trace
        if t is None or t.attentions is None:
            return None, None
        layer, head = self.view_choice(s, layer, head)
        # One layer and one head chosen: its four score terms, as strips and in the summary.
        terms = anatomy_viz.step_terms(t, layer, head, s.model.layers[0].attn.scale)
        unit = s.tokenizer.unit
        view = viz.attention_view(
            t, s.pieces, layer, head, HEATMAP_COLUMNS, unit, terms=terms, window=s.seg_len
        )
        return view, viz.step_summary(t, s.memory_info(), far=s.seg_len, terms=terms)

    @staticmethod
    def predictions_view(s: Session, t=None, history=None) -> dict | None:
        """The bars' data (webapp/web/predictions.js): step ``t``'s prediction with and
        without memory (the last step when None)."""
        t = s.last_trace if t is None else t
        return viz.predictions_view(t, s.seg_len, s.tokenizer.unit, history)

    def all_views(self, state: UserState, layer, head, started: float | None = None):
        text, text_view, status = self.text_views(state.session, layer, head)
        status += self.restore_note(state)
        attention, summary = self.attention_views(state, layer, head)
        predictions = self.predictions_view(state.session)
        if summary is not None and started is not None:
            summary["handler_ms"] = round((time.perf_counter() - started) * 1e3, 2)
        # The history slider goes back to the newest step.
        return text, text_view, status, attention, 0, summary, predictions, state

    def past_views(self, state: UserState, back: int, layer, head) -> tuple[dict, dict | None]:
        """(text view, attention view) of the step ``back`` steps ago, the text as it was."""
        s = state.session
        t = s.past_trace(back)
        if t is None or (back == 0 and s.last_trace is not None):
            _, text_view, _ = self.text_views(s, layer, head)
            return text_view, self.attention_views(state, layer, head)[0]
        layer, head = self.view_choice(s, layer, head)
        pieces, n = s.pieces[: t.position + 1], t.position + 1
        window = s.seg_len
        roles = viz.roles_from_trace(n, t, window)
        unit = s.tokenizer.unit
        text_view = viz.text_view(
            pieces,
            roles,
            t,
            layer,
            head,
            t.memory,
            unit=unit,
            effect=s.memory_effect,
            window=window,
        )
        steps_back = min(back, len(s.history) - 1)  # past_trace clamps the same way
        history = (steps_back, len(s.history))
        attention = viz.attention_view(
            t, pieces, layer, head, HEATMAP_COLUMNS, unit, history=history, window=window
        )
        return text_view, attention

    # -- public events --

    def generate(
        self,
        prompt,
        n_tokens,
        memory,
        mem_len,
        temperature,
        top_k,
        top_p,
        seed,
        layer,
        head,
        state,
        fresh=True,
    ):
        """Write n_tokens characters after the prompt (streaming), starting over from the
        prompt with the seed: the same arguments give the same text."""
        state = self.ensure(state)
        s = state.session
        with self.using(state, mem_len, steps=n_tokens):
            n = as_int("n_tokens", n_tokens, 1, MAX_NEW_TOKENS)
            self.apply_settings(s, memory, mem_len, temperature, top_k, top_p, seed)
            if fresh or not s.ids or s.prompt != (prompt or ""):
                self.start(s, prompt)
            self.check_room(s)
            last = time.perf_counter()
            # Every step captures its attention: the views stream with the text, and
            # the history can show any of the steps afterwards.
            for i, _ in enumerate(s.generate(n, capture_last_only=False)):
                if i < n - 1 and time.perf_counter() - last > STREAM_EVERY_S:
                    last = time.perf_counter()
                    text, text_view, status = self.text_views(s, layer, head)
                    attention, summary = self.attention_views(state, layer, head)
                    predictions = self.predictions_view(s)
                    yield text, text_view, status, attention, 0, summary, predictions, state
            started = time.perf_counter()
            yield self.all_views(state, layer, head, started)

    def continue_(
        self, prompt, n_tokens, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state
    ):
        """Generate n_tokens more characters after the text so far."""
        yield from self.generate(
            prompt,
            n_tokens,
            memory,
            mem_len,
            temperature,
            top_k,
            top_p,
            seed,
            layer,
            head,
            state,
            fresh=False,
        )

    def step(self, prompt, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state):
        """One more character after the text so far (starting from the prompt when the
        text is empty or the prompt was edited)."""
        started = time.perf_counter()
        state = self.ensure(state)
        settings = (memory, mem_len, temperature, top_k, top_p, seed)
        with self.using(state, mem_len, steps=1):
            self.take_step(state, prompt, settings, layer, head)
            return self.all_views(state, layer, head, started)

    def take_step(self, state: UserState, prompt, settings: tuple, layer, head, first=True):
        """Step's work, under the session's lock (Play's steps too: webapp/play.py).
        ``first=False``: a Play's later step, which leaves the settings as they are now (a
        change during Play has applied them with its own event)."""
        s = state.session
        if first:
            self.apply_settings(s, *settings)
            if not s.ids or s.prompt != (prompt or ""):
                self.start(s, prompt)
        self.check_room(s)
        # The four score terms (~20 % of a step) only when the view shows them: one head.
        # After Watch it (the Score tab), the Step writes the moment's own character.
        terms = None not in self.view_choice(s, layer, head)
        s.step(terms=terms, token=self.replayed_token(state, prompt) if first else None)

    @staticmethod
    def packed_outputs(outputs: tuple) -> tuple:
        """The page's copy of a Watch event's outputs: the four views' dicts packed as one
        JSON string each (viz.packed), which the page copies far faster; API clients get
        the dicts. ``outputs``: (text, text view, status, attention, history, summary,
        predictions, state)."""
        text, text_view, status, attention, history, summary, predictions, state = outputs
        views = (viz.packed(v) for v in (text_view, attention, summary, predictions))
        text_view, attention, summary, predictions = views
        return text, text_view, status, attention, history, summary, predictions, state

    def step_page(
        self, prompt, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state
    ):
        """The page's own Step: /step's outputs, packed (packed_outputs)."""
        return self.packed_outputs(
            self.step(prompt, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state)
        )

    def generate_page(self, *inputs):
        """The page's own Generate: /generate's stream, packed."""
        for outputs in self.generate(*inputs):
            yield self.packed_outputs(outputs)

    def continue_page(self, *inputs):
        """The page's own Continue: /continue's stream, packed."""
        for outputs in self.continue_(*inputs):
            yield self.packed_outputs(outputs)

    # -- Play: one stream of steps (webapp/play.py) --

    def page_views(self, state: UserState, layer, head) -> tuple:
        """The page's outputs of the session now, packed (Play's messages)."""
        return self.packed_outputs(self.all_views(state, layer, head))

    def play(
        self,
        play_id,
        prompt,
        memory,
        mem_len,
        temperature,
        top_k,
        top_p,
        seed,
        layer,
        head,
        state,
        request: gr.Request,
    ):
        """Play: step until paused, streaming the newest step's views (webapp/play.py)."""
        settings = (memory, mem_len, temperature, top_k, top_p, seed)
        visitor = visitor_of(request)
        yield from play_stream(
            self, self.plays, visitor, play_id, prompt, settings, layer, head, state
        )

    def play_stop(self, play_id, request: gr.Request) -> None:
        """Pause (and Step, Generate, Reset, Load while Play runs): the visitor's Plays up
        to ``play_id`` stop before their next step. No lock: it never waits."""
        self.plays.stop(visitor_of(request), as_play_id(play_id))

    def reset(self, state):
        """Forget the text and the memory (the settings stay)."""
        state = self.ensure(state)
        with self.using(state, grows=False):
            state.session.reset()
            return self.all_views(state, None, None)

    def load_model(self, source, state, progress=gr.Progress()):  # noqa: B008 (Gradio's way)
        """Load a model (a folder or a Hub repo id) for this browser session only; on
        failure the current model stays."""
        source = (source or "").strip()
        if not source:
            raise gr.Error("Type a folder or a Hub repo id like 'org/name'.")
        if len(source) > MAX_SOURCE_CHARS:
            raise gr.Error(
                f"Could not load the model, keeping the current one. The source is "
                f"{len(source):,} characters: a Hub repo id is 'org/name' (at most 96 "
                f"characters each) and a folder path at most {MAX_SOURCE_CHARS}."
            )
        progress(0.0, desc=f"loading {source}")
        try:
            if not allowed_folder(resolve_source(source), self.model_dirs):
                raise TXLLoadError(
                    f"{source!r} is a folder outside the ones this app may read models from "
                    "(set TXL_MODEL_DIRS to allow it); a Hub repo id looks like 'org/name'"
                )
            model = self.cache.get(source, progress)
        except TXLLoadError as e:
            raise gr.Error(f"Could not load the model, keeping the current one. {e}") from None
        new = self.new_state(resolve_source(source), model)
        if state is None or state.expired:
            state = self.sessions.add(new)
        else:  # the same UserState, so that a Generate still running cannot bring back
            with user_errors(state):  # the old model when it ends; settings are kept
                old, s = state.session, new.session
                s.temperature, s.top_k, s.top_p = old.temperature, old.top_k, old.top_p
                s.set_seed(old.seed)
                s.set_memory(old.memory)
                state.source, state.session = new.source, s
        progress(1.0, desc="ready")
        c = model.config
        return (
            model_markdown(source, model, self.mem_cap(model)),
            *self.all_views(state, None, None),
            gr.Dropdown(**layer_choices(c)),
            gr.Dropdown(**head_choices(c)),
            gr.Slider(value=state.session.mem_len),
            gr.Slider(value=state.session.mem_len),
        )

    # -- private events --

    def settings_changed(
        self, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state
    ):
        """Memory switched on/off or its length changed: rebuild and redraw the text (packed
        for the page). A sampling setting changed: it applies now (a Play running goes on
        with it, as the next Step would)."""
        if state is None:  # nothing generated yet: the settings apply at the first step
            return gr.skip(), gr.skip(), state
        with self.using(state, mem_len):
            self.apply_settings(state.session, memory, mem_len, temperature, top_k, top_p, seed)
            _, text_view, status = self.text_views(state.session, layer, head)
            return viz.packed(text_view), status + self.restore_note(state), state

    def redraw(self, back, layer, head, state):
        """Layer or head changed, or the history slider moved: both views again, of the
        step the slider shows (0: the newest; -k: k steps back)."""
        if state is None or state.expired:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        with self.using(state, grows=False):  # the history may be on disk
            back = -as_int("history", back, -HISTORY_STEPS, 0)
            return *self.past_views(state, back, layer, head), *self.past_step(state, back)

    def redraw_page(self, back, layer, head, state, request: gr.Request):
        """The page's redraw: the views packed; a running Play draws this layer and head."""
        views = self.redraw(back, layer, head, state)
        if state is None or state.expired:  # nothing to draw: redraw skipped them
            return views
        self.plays.choose_view(visitor_of(request), layer, head)
        return tuple(viz.packed(v) for v in views)

    def past_step(self, state: UserState, back: int) -> tuple[dict | None, dict | None]:
        """(step summary, predictions view) of the step ``back`` steps ago."""
        s = state.session
        t = s.last_trace if back == 0 and s.last_trace is not None else s.past_trace(back)
        if t is None:
            return None, None
        history = None if t is s.last_trace else (min(back, len(s.history) - 1), len(s.history))
        summary = viz.step_summary(t, far=s.seg_len)
        return summary, self.predictions_view(s, t, history)

    def export(self, state):
        """The last step's attention as a JSON file."""
        t = state.session.last_trace if state is not None else None
        if t is None or t.attentions is None:
            gr.Warning("Nothing to export yet: Step or Generate first.")
            return gr.File(value=None, visible=False)
        for old in self.export_dir.glob("*.json"):  # keep the folder small
            if time.time() - old.stat().st_mtime > 600:
                old.unlink(missing_ok=True)
        path = self.export_dir / f"attention-pos{t.position}-{time.time_ns()}.json"
        export = viz.attention_export(t, state.session.pieces)
        path.write_text(json.dumps(export, ensure_ascii=False))
        return gr.File(value=str(path), visible=True)

    # -- the page --

    def build(self) -> gr.Blocks:
        """The page: a header, the "Watch the memory" tab, the "Does memory help?" tab."""
        ttl = self.sessions.ttl
        with gr.Blocks(title="Transformer-XL memory", delete_cache=(600, 3600)) as demo:
            state = gr.State(None, time_to_live=ttl, delete_callback=self.sessions.release)
            gr.Markdown(HEADER, elem_id="header")
            with gr.Tabs(elem_id="tabs") as tabs:
                with gr.Tab("Watch the memory", id="watch"):
                    ui = self.watch_tab()
                with gr.Tab("Does memory help?", id="score"):
                    ui.update(score_tab.build(self))
                with gr.Tab("How far back can it recall?", id="recall"):
                    ui.update(recall_tab.build(self))
                with gr.Tab("Inside the attention", id="anatomy"):
                    ui.update(anatomy_tab.build(self, EXAMPLES))
            ui["tabs"] = tabs  # Watch it (the Score tab) switches to the Watch tab
            self.wire(ui, state)
            anatomy_tab.wire(self, ui, state)
            recall_tab.wire(self, ui, state)  # /recall
            moments_tab.wire(self, ui, state)  # the Watch tab's examples
            # the tabs' sliders
            api_names = {"score_mem": "mem_len", "anatomy_mem": "mem_len", "recall_mem": "mem_len"}
            name_input_errors((api_names.get(k, k), c) for k, c in ui.items())
        return demo

    def watch_tab(self) -> dict:
        """Model source, prompt and buttons, settings, the text (left), attention (right)."""
        c = self.default_model.config if self.default_model else TXLConfig(vocab=["a"])
        mem_len = self.start_mem_len(self.default_model) if self.default_model else c.mem_len
        ui = {}
        with gr.Row():
            shown = display_source(self.default_source)
            ui["source"] = gr.Textbox(
                shown, label="Model: a folder or a Hub repo id", scale=4, elem_id="source"
            )
            ui["load"] = gr.Button("Load", scale=1, min_width=90, elem_id="load")
        notice = f"\n\n⚠️ {self.load_notice}" if self.load_notice else ""
        ui["model_info"] = gr.Markdown(
            self.model_info() + notice, label="model", elem_id="model-info"
        )
        with gr.Row(elem_id="main-row"):
            with gr.Column(scale=5, min_width=340, elem_id="left"):
                # The examples where memory matters, what to look at, and the prompt.
                ui.update(moments_tab.build(self))
                with gr.Row():
                    for name, variant in BUTTONS:
                        ui[name] = gr.Button(
                            name.title(), variant=variant, elem_id=name, min_width=70, size="md"
                        )
                # Triggers the page never shows: the API's /step, /generate and /continue
                # (the views as dicts; the page's buttons get them packed), and Play's
                # stream and its stop, which webapp/web/views.js clicks with its Play number.
                ui["step_api"] = gr.Button("Step", visible=False, elem_id="step_api")
                ui["generate_api"] = gr.Button("Generate", visible=False, elem_id="generate_api")
                ui["continue_api"] = gr.Button("Continue", visible=False, elem_id="continue_api")
                ui["play_run"] = gr.Button("Play", visible="hidden", elem_id="play_run")
                ui["play_stop"] = gr.Button("Pause", visible="hidden", elem_id="play_stop")
                ui["play_id"] = gr.Number(0, precision=0, visible=False, elem_id="play_id")
                ui["n_tokens"] = gr.Slider(
                    1,
                    MAX_NEW_TOKENS,
                    value=120,
                    step=1,
                    label="Characters to generate",
                    elem_id="n_tokens",
                )
                # One line, **bold** its only markup (webapp/web/summary.js): a gr.Markdown
                # parsed and sanitised it anew on every Step.
                ui["status"] = gr.HTML(
                    "Memory **on** · nothing generated yet",
                    html_template=STATUS_TEMPLATE,
                    js_on_load="TXL.mountStatus(element, props, watch)",
                    label="memory status",
                    elem_id="status",
                )
                ui["text_html"] = gr.HTML(
                    None,
                    html_template=TEXT_TEMPLATE,
                    js_on_load="TXL.mountText(element, props, watch)",
                    label="text shaded by attention",
                    max_height=460,
                    autoscroll=True,
                    elem_id="text",
                )
                with gr.Accordion("Memory and sampling", open=True):
                    with gr.Row():
                        ui["memory"] = gr.Checkbox(
                            True, label="Memory (Transformer-XL)", elem_id="memory", min_width=160
                        )
                        ui["mem_len"] = gr.Slider(
                            0,
                            MAX_MEM_LEN,
                            value=mem_len,
                            step=1,
                            label="mem_len",
                            elem_id="mem_len",
                            min_width=160,
                        )
                    with gr.Row():
                        ui["temperature"] = gr.Slider(
                            0,
                            2,
                            value=0.8,
                            step=0.05,
                            min_width=120,
                            label="temperature (0 = greedy)",
                        )
                        ui["top_k"] = gr.Slider(
                            0, 100, value=0, step=1, min_width=120, label="top-k (0 = off)"
                        )
                        ui["top_p"] = gr.Slider(
                            0.05, 1, value=1.0, step=0.05, label="top-p", min_width=120
                        )
                        ui["seed"] = gr.Number(0, precision=0, label="seed", min_width=90)
                with gr.Accordion("Plain text", open=False):
                    ui["text_out"] = gr.Textbox(
                        label="Text so far",
                        lines=6,
                        interactive=False,
                        buttons=["copy"],
                        elem_id="text_out",
                    )
            with gr.Column(scale=6, min_width=340, elem_id="right"):
                with gr.Row():
                    ui["layer"] = gr.Dropdown(**layer_choices(c), label="Layer", min_width=140)
                    ui["head"] = gr.Dropdown(**head_choices(c), label="Head", min_width=140)
                ui["attention"] = gr.HTML(
                    None,
                    html_template=ATTENTION_TEMPLATE,
                    # webapp/web/terms.js: the chosen head's four score terms, under the view
                    js_on_load="TXL.mountAttention(element, props, watch); "
                    "TXL.mountTerms(element, props, watch)",
                    label="Attention of the newest token",
                    elem_id="attention",
                )
                ui["predictions"] = gr.HTML(
                    None,
                    html_template=PREDICTIONS_TEMPLATE,
                    js_on_load="TXL.mountPredictions(element, props, watch)",
                    label="Next-token prediction with and without memory",
                    elem_id="predictions",
                )
                ui["history"] = gr.Slider(
                    -(HISTORY_STEPS - 1),
                    0,
                    value=0,
                    step=1,
                    label="Step history: 0 = the newest step, -k = k steps back",
                    elem_id="history",
                )
                with gr.Row():
                    ui["export"] = gr.Button("Export attention (JSON)", size="sm", elem_id="export")
                    ui["export_file"] = gr.File(
                        label="attention.json", visible=False, elem_id="export_file"
                    )
                with gr.Accordion("Last step (JSON)", open=False):
                    # Drawn by webapp/web/summary.js, only while open: the page's Step sends
                    # it packed (viz.packed), one JSON string that a gr.JSON cannot show.
                    ui["summary"] = gr.HTML(
                        None,
                        html_template=SUMMARY_TEMPLATE,
                        js_on_load="TXL.mountSummary(element, props, watch)",
                        label="summary",
                        elem_id="summary",
                    )
                gr.Markdown(HEATMAP_HELP)
        return ui

    def wire(self, ui: dict, state: gr.State) -> None:
        """Events: five public endpoints, the rest private."""
        settings = [ui[k] for k in ("memory", "mem_len", "temperature", "top_k", "top_p", "seed")]
        view = [ui["layer"], ui["head"]]
        views = [ui[k] for k in ("text_out", "text_html", "status", "attention", "history")]
        views.append(ui["summary"])
        views.append(ui["predictions"])  # a new output goes here: the state stays last
        views.append(state)
        gen_inputs = [ui["prompt"], ui["n_tokens"], *settings, *view, state]
        model = dict(concurrency_id="model")  # Generate, Continue and Step share a limit

        page = dict(api_visibility="private", show_progress="hidden")
        # The API's events (views as dicts) have triggers the page never shows; the page's
        # buttons run the same handlers with the views packed (packed_outputs).
        ui["generate_api"].click(self.generate, gen_inputs, views, api_name="generate", **model)
        ui["generate"].click(
            self.generate_page, gen_inputs, views, api_visibility="private", **model
        )
        step_inputs = [ui["prompt"], *settings, *view, state]
        ui["step_api"].click(self.step, step_inputs, views, api_name="step", **model)
        # A click while the last Step still runs: run it after, rather than drop it (the
        # default for buttons).
        ui["step"].click(
            self.step_page, step_inputs, views, trigger_mode="always_last", **page, **model
        )
        # Play: one stream of steps (webapp/play.py), started and stopped by views.js with
        # its Play number; several may be in flight (a Pause, then Play again at once).
        ui["play"].click(None, js="() => { TXL.togglePlay(); }")
        # /play and /play_stop are undocumented API endpoints (a client passes play_id).
        page_api = dict(api_visibility="undocumented", show_progress="hidden")
        with_id = dict(js="(...inputs) => TXL.withPlayId(...inputs)", trigger_mode="multiple")
        play_inputs = [ui["play_id"], *step_inputs]
        ui["play_run"].click(
            self.play,
            play_inputs,
            views,
            api_name="play",
            concurrency_id="play",
            **with_id,
            **page_api,
        ).then(None, js="() => { TXL.playEnded(); }")
        stop_inputs = [ui["play_id"]]
        ui["play_stop"].click(
            self.play_stop,
            stop_inputs,
            None,
            api_name="play_stop",
            concurrency_limit=None,
            **with_id,
            **page_api,
        )
        ui["reset"].click(self.reset, [state], views, api_name="reset")
        score_tab.wire(self, ui, state, views)  # /score, and Watch it
        ui["load"].click(
            self.load_model,
            [ui["source"], state],
            [ui["model_info"], *views, *view, ui["mem_len"], ui["score_mem"]],
            api_name="load_model",
            concurrency_limit=2,
            show_progress="full",
        )

        private = dict(api_visibility="private")
        ui["continue_api"].click(
            self.continue_,
            gen_inputs,
            views,
            api_name="continue",
            api_visibility="undocumented",
            **model,
        )
        ui["continue"].click(self.continue_page, gen_inputs, views, **private, **model)
        sampling = [ui[k].release for k in ("temperature", "top_k", "top_p")]
        for event in (ui["memory"].change, ui["mem_len"].release, *sampling, ui["seed"].blur):
            event(
                self.settings_changed,
                [*settings, *view, state],
                [ui["text_html"], ui["status"], state],
                **private,
            )
        redraw = [ui["history"], *view, state]
        # The slider's input event: the user's own moves only (a Step setting it back to 0
        # sends none), live while dragging; always_last skips the positions passed over.
        for event in (ui["layer"].change, ui["head"].change, ui["history"].input):
            event(
                self.redraw_page,
                redraw,
                [ui["text_html"], ui["attention"], ui["summary"], ui["predictions"]],
                trigger_mode="always_last",
                show_progress="hidden",
                **private,
            )
        ui["export"].click(self.export, [state], [ui["export_file"]], **private)


def layer_choices(config: TXLConfig) -> dict:
    return dict(
        choices=[ALL_LAYERS] + [f"layer {i}" for i in range(config.n_layer)], value=ALL_LAYERS
    )


def head_choices(config: TXLConfig) -> dict:
    return dict(
        choices=[MEAN_HEADS] + [f"head {i}" for i in range(config.n_head)], value=MEAN_HEADS
    )


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

HEATMAP_HELP = """\
Rows are layers (or the heads of one layer), columns the keys in text order: \
**memory** left of the dashed line, the **current segment** right of it (in step-by-step \
generation the current segment is the new token itself). The solid blue line is the edge \
of **the window**: the last `tgt_len` tokens, all that a model without memory sees; keys \
left of it are reachable only through memory. The bar on the right is each row's share of \
attention **beyond the window** (its share on all of memory in lighter blue behind it), \
and the status line leads with it. Beyond 160 keys, columns sum buckets of neighbouring \
keys. Hover a cell, or a character of the text, for its weight and distance; **⤓ PNG** \
saves the view. Under it, the **next-character prediction with memory and without** (the \
same model on only the last segment): the sampled character is outlined, and \
*shade by: memory's effect* colours the text by the bits memory saved on each character. \
**Play** steps on by itself until you click it again; the **step history** slider shows \
any of the last 256 steps over the text as it was then.
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
    app = TXLApp()
    for problem in (app.load_error, app.load_notice):
        if problem:
            print(f"warning: {problem}")
    launch(app.build())


if __name__ == "__main__":
    main()
