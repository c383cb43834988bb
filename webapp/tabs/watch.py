"""The "Watch the memory" tab: the model box, the examples and the prompt, Generate /
Continue / Step / Play / Reset, the memory and sampling settings, and what each step shows:
the text shaded by the newest token's attention, that attention over memory and the
current segment, the next-token prediction with and without memory, a step history.

    WatchTab(service).build() -> dict of components     .wire(ui, state)

A handler takes the page's inputs one by one (as Gradio passes them, in the API's order),
reads its ``Settings`` out of them at once (``Settings.of(locals())``) and returns a
``WatchViews``: every event that redraws the tab has these eight outputs, in this order.
What the tab shows of a session comes from webapp/tabs/watch_views.py (drawn by
webapp/watch_viz.py); the examples above the prompt from webapp/tabs/watch_examples.py;
Play, one stream of Steps, from webapp/tabs/watch_play.py.
To add an event: a method here that returns a WatchViews (``current_views``), wired in
``wire`` with ``outputs(ui, state)``; the page's own events send it ``.packed()``.
"""

from __future__ import annotations

import json
import time

import gradio as gr

from txl import TXLConfig
from txl.hub import TXLLoadError
from txl.session import Session
from webapp import figures, watch_viz
from webapp.inputs import as_int
from webapp.serve import (
    HISTORY_STEPS,
    MAX_GENERATE,
    MAX_MEM_LEN,
    DemoService,
    Settings,
    display_source,
)
from webapp.visitors import VisitorState

from . import watch_examples
from .parts import page_view, sampling_controls
from .watch_play import WatchPlay
from .watch_views import (
    ATTENTION_TEMPLATE,
    PREDICTIONS_TEMPLATE,
    STATUS_TEMPLATE,
    SUMMARY_TEMPLATE,
    TEXT_TEMPLATE,
    WatchViews,
    attention_views,
    current_views,
    head_choices,
    layer_choices,
    model_markdown,
    outputs,
    past_step,
    past_views,
    predictions_view,
    restore_note,
    text_views,
    view_choice,
)

MAX_SOURCE_CHARS = 256  # the Load box: a Hub id is at most 96 + 1 + 96 characters
MAX_TEXT_CHARS = 100_000  # a session's text: Continue and Step stop here (Reset starts over)
STREAM_EVERY_S = 0.08  # Generate sends the text at most this often

BUTTONS = [
    ("generate", "primary"),
    ("continue", "secondary"),
    ("step", "secondary"),
    ("play", "secondary"),
    ("reset", "stop"),
]
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


class WatchTab:
    """The tab's handlers, on the shared service (composition: the service knows no tab)."""

    def __init__(self, service: DemoService):
        self.service = service
        self.play = WatchPlay(self)  # Play: its stream, control and events
        # The examples' prompts and the character that follows each (watch_examples)
        self.next_characters = watch_examples.next_characters(watch_examples.load_moments())

    def model_info(self) -> str:
        """The model line under the Load box: the service's default model."""
        service = self.service
        if service.default_model is None:
            return f"**No model loaded**: {service.load_error}"
        model, source = service.default_model, display_source(service.default_source)
        return model_markdown(source, model, service.mem_cap(model))

    # -- public events: the inputs as the API sends them, then Settings --

    def generate(
        self, prompt, n_tokens, memory, mem_len, temperature, top_k, top_p, seed, layer, head,
        state, fresh=True,
    ):  # fmt: skip
        """Write n_tokens characters after the prompt (streaming), starting over from the
        prompt with the seed: the same arguments give the same text."""
        settings = Settings.of(locals())
        service = self.service
        state = service.ensure(state)
        s = state.session
        with service.using(state, mem_len, steps=n_tokens):
            n = as_int("n_tokens", n_tokens, 1, MAX_GENERATE)
            service.apply_settings(s, settings)
            if fresh or not s.ids or s.prompt != (prompt or ""):
                service.start_from_prompt(s, prompt)
                state.given = None
            check_room(s)
            last = time.perf_counter()
            # Every step captures its attention: the views stream with the text, and
            # the history can show any of the steps afterwards.
            for i, _ in enumerate(s.generate(n, capture_last_only=False)):
                # The first step is sent at once, as Play and the pair's Generate send
                # theirs: a new visitor's state then reaches Gradio's store before a Load
                # sent meanwhile reads it (else that Load makes a second state, which this
                # Generate's last frame would overwrite).
                due = i == 0 or time.perf_counter() - last > STREAM_EVERY_S
                if i < n - 1 and due:
                    last = time.perf_counter()
                    text, text_view, status = text_views(s, layer, head)
                    attention, summary = attention_views(state, layer, head)
                    predictions = predictions_view(state)
                    yield WatchViews(
                        text, text_view, status, attention, 0, summary, predictions, state
                    )
            yield current_views(state, layer, head, time.perf_counter())

    def continue_(self, *inputs):
        """Generate n_tokens more characters after the text so far (generate's inputs)."""
        yield from self.generate(*inputs, fresh=False)

    def step(self, prompt, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state):
        """One more character after the text so far (starting from the prompt when the
        text is empty or the prompt was edited)."""
        started = time.perf_counter()
        settings = Settings.of(locals())
        return self.step_with(settings, prompt, layer, head, state, started)

    def step_with(self, settings: Settings, prompt, layer, head, state, started=None):
        """The Step itself, its inputs gathered: /step's and the page's Step's."""
        state = self.service.ensure(state)
        with self.service.using(state, settings.mem_len, steps=1):
            self.take_step(state, prompt, settings, layer, head)
            return current_views(state, layer, head, started)

    def take_step(self, state: VisitorState, prompt, settings: Settings, layer, head, first=True):
        """Step's work, under the session's lock (``using``): Play's steps too (watch_play).
        ``first=False``: a Play's later step, which leaves the settings as they are now (a
        change during Play has applied them with its own event)."""
        s = state.session
        if first:
            self.service.apply_settings(s, settings)
            if not s.ids or s.prompt != (prompt or ""):
                self.service.start_from_prompt(s, prompt)
                state.given = None
        check_room(s)
        # The four score terms (~20 % of a step) only when the view shows them: one head.
        terms = None not in view_choice(s, layer, head)
        token = self.given_token(state, prompt) if first else None
        t = s.step(terms=terms, token=token)
        if token is not None:
            state.given = (t.position, t.token_id)

    def given_token(self, state: VisitorState, prompt) -> int | None:
        """The token a Step writes instead of sampling one: after Watch it (the Score
        tab), the moment's own; from an example's prompt alone, the character that follows
        it in its source (the guide above the prompt names it)."""
        token = replayed_token(state, prompt)
        if token is not None:
            return token
        s = state.session
        char = self.next_characters.get(s.text) if s.text == (prompt or "") else None
        if s.tokenizer.unit == "character" and char in s.tokenizer.stoi:
            return s.tokenizer.stoi[char]
        return None

    # The page's own Step, Generate and Continue: the API's outputs (the same inputs), the
    # four views' dicts packed as one JSON string each, which the page copies far faster.

    def step_page(self, *inputs) -> WatchViews:
        return self.step(*inputs).packed()

    def generate_page(self, *inputs):
        for views in self.generate(*inputs):
            yield views.packed()

    def continue_page(self, *inputs):
        for views in self.continue_(*inputs):
            yield views.packed()

    def reset(self, state):
        """Forget the text and the memory (the settings stay)."""
        state = self.service.ensure(state)
        with self.service.using(state, grows=False):
            state.session.reset()
            state.given = None
            return current_views(state, None, None)

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
            state = self.service.load(source, state, progress)
        except TXLLoadError as e:
            raise gr.Error(f"Could not load the model, keeping the current one. {e}") from None
        progress(1.0, desc="ready")
        model = state.model
        c, mem_len = model.config, state.session.mem_len
        return (
            model_markdown(source, model, self.service.mem_cap(model)),
            *current_views(state, None, None),
            gr.Dropdown(**layer_choices(c)),
            gr.Dropdown(**head_choices(c)),
            gr.Slider(value=mem_len),
            gr.Slider(value=mem_len),  # the Score tab's
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
        settings = Settings.of(locals())
        with self.service.using(state, mem_len):
            self.service.apply_settings(state.session, settings)
            _, text_view, status = text_views(state.session, layer, head)
            return figures.packed(text_view), status + restore_note(state), state

    def redraw(self, back, layer, head, state):
        """Layer or head changed, or the history slider moved: both views again, of the
        step the slider shows (0: the newest; -k: k steps back)."""
        if state is None or state.expired:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        with self.service.using(state, grows=False):  # the history may be on disk
            back = -as_int("history", back, -HISTORY_STEPS, 0)
            return *past_views(state, back, layer, head), *past_step(state, back)

    def redraw_page(self, back, layer, head, state, request: gr.Request):
        """The page's redraw: the views packed; a running Play draws this layer and head."""
        views = self.redraw(back, layer, head, state)
        if state is None or state.expired:  # nothing to draw: redraw skipped them
            return views
        self.play.choose_view(layer, head, request)
        return tuple(figures.packed(v) for v in views)

    def export(self, state):
        """The last step's attention as a JSON file."""
        t = state.session.last_trace if state is not None else None
        if t is None or t.attentions is None:
            gr.Warning("Nothing to export yet: Step or Generate first.")
            return gr.File(value=None, visible=False)
        folder = self.service.export_dir
        for old in folder.glob("*.json"):  # keep the folder small
            if time.time() - old.stat().st_mtime > 600:
                old.unlink(missing_ok=True)
        path = folder / f"attention-pos{t.position}-{time.time_ns()}.json"
        export = watch_viz.attention_export(t, state.session.pieces)
        path.write_text(json.dumps(export, ensure_ascii=False))
        return gr.File(value=str(path), visible=True)

    # -- the page --

    def build(self) -> dict:
        """Model source, prompt and buttons, settings, the text (left), attention (right)."""
        service = self.service
        model = service.default_model
        c = model.config if model else TXLConfig(vocab=["a"])
        mem_len = service.start_mem_len(model) if model else c.mem_len
        ui = {}
        with gr.Row():
            shown = display_source(service.default_source)
            ui["source"] = gr.Textbox(
                shown, label="Model: a folder or a Hub repo id", scale=4, elem_id="source"
            )
            ui["load"] = gr.Button("Load", scale=1, min_width=90, elem_id="load")
        notice = f"\n\n⚠️ {service.load_notice}" if service.load_notice else ""
        ui["model_info"] = gr.Markdown(
            self.model_info() + notice, label="model", elem_id="model-info"
        )
        with gr.Row(elem_id="main-row"):
            with gr.Column(scale=5, min_width=340, elem_id="left"):
                # The examples where memory matters, what to look at, and the prompt.
                ui.update(watch_examples.build(service))
                with gr.Row():
                    for name, variant in BUTTONS:
                        ui[name] = gr.Button(
                            name.title(), variant=variant, elem_id=name, min_width=70, size="md"
                        )
                # Triggers the page never shows: the API's /step, /generate and /continue
                # (the views as dicts; the page's buttons get them packed), and Play's.
                for name in ("step", "generate", "continue"):
                    ui[f"{name}_api"] = gr.Button(
                        name.title(), visible=False, elem_id=f"{name}_api"
                    )
                ui.update(self.play.build())
                ui["n_tokens"] = gr.Slider(
                    1,
                    MAX_GENERATE,
                    value=120,
                    step=1,
                    label="Characters to generate",
                    elem_id="n_tokens",
                )
                # One line, **bold** its only markup (webapp/web/summary.js): a gr.Markdown
                # parsed and sanitised it anew on every Step.
                ui["status"] = page_view(
                    STATUS_TEMPLATE,
                    "mountStatus",
                    value="Memory **on** · nothing generated yet",
                    label="memory status",
                    elem_id="status",
                )
                ui["text_html"] = page_view(
                    TEXT_TEMPLATE,
                    "mountText",
                    label="text shaded by attention",
                    elem_id="text",  # its text scrolls under the legend (webapp/web/views.css)
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
                    ui.update(sampling_controls("", "seed"))
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
                ui["attention"] = page_view(
                    ATTENTION_TEMPLATE,
                    "mountAttention",
                    "mountTerms",  # webapp/web/terms.js: the chosen head's four score terms
                    label="Attention of the newest token",
                    elem_id="attention",
                )
                ui["predictions"] = page_view(
                    PREDICTIONS_TEMPLATE,
                    "mountPredictions",
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
                    # it packed (figures.packed), one JSON string that a gr.JSON cannot show.
                    ui["summary"] = page_view(
                        SUMMARY_TEMPLATE, "mountSummary", label="summary", elem_id="summary"
                    )
                gr.Markdown(HEATMAP_HELP)
        return ui

    def wire(self, ui: dict, state: gr.State) -> None:
        """Events: five public endpoints, the rest private."""
        settings = [ui[k] for k in SETTINGS]
        view = [ui["layer"], ui["head"]]
        views = outputs(ui, state)
        gen_inputs = [ui["prompt"], ui["n_tokens"], *settings, *view, state]
        model = dict(concurrency_id="model")  # Generate, Continue and Step share a limit

        page = dict(api_visibility="private", show_progress="hidden")
        # The API's events (views as dicts) have triggers the page never shows; the page's
        # buttons run the same handlers with the views packed (step_page, ...).
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
        self.play.wire(ui, step_inputs, views)  # Play: one stream of steps (watch_play.py)
        ui["reset"].click(self.reset, [state], views, api_name="reset")
        ui["load"].click(
            self.load_model,
            [ui["source"], state],
            # the Score tab's mem_len too: it follows the model
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
        watch_examples.wire(self.service, ui, state)


# The settings' components, in the order of the handlers' inputs (Settings' fields).
SETTINGS = ("memory", "mem_len", "temperature", "top_k", "top_p", "seed")


def check_room(s: Session) -> None:
    """Continue and Step stop at MAX_TEXT_CHARS: the text is sent whole with every answer,
    and kept in memory for the session's life."""
    if len(s.text) >= MAX_TEXT_CHARS:
        raise ValueError(
            f"the text is {len(s.text):,} characters, the most one session holds "
            f"({MAX_TEXT_CHARS:,}): Reset, or Generate to start over from the prompt"
        )


def replayed_token(state: VisitorState, prompt) -> int | None:
    """The token Watch it (the Score tab) left for this Step, while the session still holds
    the prompt Watch it started and nothing after it (then once: the Step consumes it)."""
    replay, state.replay = state.replay, None
    if replay is None:
        return None
    at_prompt, n_tokens, token = replay
    s = state.session
    return token if at_prompt == (prompt or "") == s.prompt and len(s.ids) == n_tokens else None
