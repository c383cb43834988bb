"""The "Memory on | off" tab: one prompt, two generations that share their randomness,
side by side. Left, the model with its memory (mem_len); right, the same model through its
window of tgt_len characters, recomputed at every step (the Watch tab's "without memory").
Both choose each character with the same Gumbel draws (txl/counterfactual.py), so the texts
are identical until memory moves a choice, and every difference after that is memory's.

    MemoryPairTab(service).build() -> dict of components     .wire(ui, state)

Step, Play (one stream of Steps, as the Watch tab's) and Generate N (from the prompt
again) on the visitor's ``state.pair``; Reset; the examples (scenes where memory brings a
speaker back, found by scripts/find_memory_pairs.py); "Open in Watch": the Watch tab one
Step before the parting point. The views come from webapp/memory_pair_viz.py, drawn by
webapp/web/pair.js. API: /pair_step and /pair_generate (the views as dicts).
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import gradio as gr

from txl.checks import check_seed, check_temperature, check_top_p
from txl.counterfactual import MemoryPair
from webapp import figures, memory_pair_viz
from webapp.budget import growth_bytes
from webapp.inputs import as_int, number
from webapp.serve import (
    MAX_GENERATE,
    MAX_MEM_LEN,
    DemoService,
    Settings,
    check_prompt,
    warn_unknown,
)
from webapp.visitors import VisitorState, user_errors

from .examples import read_report
from .parts import page_view, sampling_controls
from .watch_play import PLAY_EVERY_S, PlayControl, as_play_id, visitor_of
from .watch_views import STATUS_TEMPLATE, current_views, outputs

MAX_PAIR_STEPS = 2000  # Step and Play stop here: both texts go to the page at every step
STREAM_EVERY_S = 0.08  # Generate sends the texts at most this often
EXAMPLES_FILE = Path(__file__).with_name("memory_pairs.json")
PAIR_TEMPLATE = (
    '<div class="txl-pair"><div class="txl-pair-texts">'
    '<div class="txl-pair-side" data-side="memory"><div class="txl-pair-title"></div>'
    '<div class="txl-pair-text"></div></div>'
    '<div class="txl-pair-side" data-side="window"><div class="txl-pair-title"></div>'
    '<div class="txl-pair-text"></div></div></div>'
    '<div class="txl-pair-part"></div><canvas class="txl-pair-strip"></canvas>'
    '<div class="txl-tip"></div></div>'
)
EXAMPLES_LABEL = "Start here: a scene where memory brings a speaker back"
SETTINGS = ("pair_mem_len", "pair_temperature", "pair_top_k", "pair_top_p", "pair_seed")
HELP = """\
**Two generations, one set of dice.** Each character is chosen by the Gumbel-max rule:
one random draw per character of the vocabulary per step, the *same draws on both sides*,
added to each side's log-probabilities (after temperature, top-k and top-p), the largest
wins. Where the two predictions are equal, the two sides pick the same character; they
**part** only where memory moved the probabilities enough to change the winner. After
that, each side goes on from its own text with the same draws. **Left**: the model with
its memory of `mem_len` characters (Transformer-XL). **Right**: the same model through the
window of its training length, recomputed from scratch at every step (no memory).
Characters that differ are marked; the first parting shows both predictions at that step
and where the memory side's last shared character looked (its attention, averaged over
layers and heads; left of the blue line: beyond the window, reachable only through
memory). **Open in Watch** puts the shared text in the Watch tab's prompt, memory on:
one Step there writes the memory side's character with both predictions (Watch reads the
shared text as a prompt, in segments, so its numbers may differ a little from these,
whose memory side wrote it one character at a time).
"""


def load_examples(path: Path = EXAMPLES_FILE) -> dict | None:
    """scripts/find_memory_pairs.py's report, or None when missing or unreadable."""
    return read_report(path, "examples", "prompt")


def example_label(example: dict) -> str:
    """'seed 3 · memory: ROMEO ← back · window: invents First Lord'."""
    memory, window = example["memory_speaker"], example["window_speaker"]
    return (
        f"seed {example['seed']} · {example['back']} characters back: memory writes "
        f"{memory}, the window {window}"
    )


def example_guide(report: dict | None, choice: str | None) -> str:
    if report is None:
        return "(No examples: run `scripts/find_memory_pairs.py`.)"
    if choice is None:
        return "**Start here:** pick a scene, then **Generate**."
    e = report["examples"][int(choice)]
    sampler = f"temperature {report['temperature']}"
    if report["top_p"] < 1:  # the sliders the example sets, as the status line names them
        sampler += f", top-p {report['top_p']}"
    return (
        f"**Generate {e['n']}.** The prompt ends after a speech; the next speaker, "
        f"**{e['memory_speaker']}**, last spoke {e['back']} characters back: beyond the "
        f"window of {report['seg_len']}, within the memory of {report['mem_len']}. With "
        f"seed {e['seed']} ({sampler}) the memory side writes "
        f"*{e['memory_speaker']}*, the window side *{e['window_speaker']}*."
    )


class MemoryPairTab:
    """The tab's handlers, on the shared service."""

    def __init__(self, service: DemoService):
        self.service = service
        self.control = PlayControl()  # every visitor's Play and Pause on this tab

    # -- the pair of a visitor --

    def checked(self, model, mem_len, temperature, top_k, top_p, seed) -> dict:
        """The settings as MemoryPair takes them, each checked with the page's messages;
        mem_len within the model's per-session cap (with a warning)."""
        settings = dict(
            mem_len=as_int("mem_len", mem_len, 0, MAX_MEM_LEN),
            temperature=check_temperature(number("temperature", temperature)),
            top_k=as_int("top_k", top_k, 0, 1_000_000),
            top_p=check_top_p(number("top_p", top_p)),
            seed=check_seed(number("seed", seed, integer=True)),
        )
        cap = self.service.mem_cap(model)
        if settings["mem_len"] > cap:
            gr.Warning(f"mem_len {settings['mem_len']:,} is above this model's cap; using {cap:,}.")
            settings["mem_len"] = cap
        return settings

    @contextmanager
    def using(self, state: VisitorState, prompt, sent: tuple, steps: int, fresh=False):
        """The visitor's pair for (prompt, settings ``sent``), under the visitor's lock and
        with room in the memory budget for both its sessions after ``steps`` steps: the
        pair as it is when it was started from this prompt with these settings and
        ``fresh`` is False, else a new one started from the prompt (nothing is changed
        when a setting is refused)."""
        with self.service.using(state, grows=False):
            model = state.model
            settings = self.checked(model, *sent)
            key = (model, check_prompt(prompt), tuple(settings.values()))
            pair = state.pair
            if fresh or pair is None or state.pair_key != key or pair.steps == 0:
                pair = MemoryPair(model, **settings)
                fresh = True
            with ExitStack() as budgets:
                for s in pair.sessions:
                    growth = growth_bytes(s, settings["mem_len"], steps)
                    budgets.enter_context(self.service.budget.use(s, state.lock, growth))
                if fresh:
                    warn_unknown(pair.with_memory, pair.start(key[1]))
                    self.forget(state)
                    state.pair, state.pair_key = pair, key
                yield pair

    def forget(self, state: VisitorState) -> None:
        """The visitor's old pair leaves the memory budget."""
        if state.pair is not None:
            for s in state.pair.sessions:
                self.service.budget.release(s)
            state.pair = state.pair_key = None

    @staticmethod
    def views(pair: MemoryPair | None) -> tuple[dict | None, str]:
        """(the pair's view, the status line)."""
        settings = None
        if pair is not None:
            s = pair.with_memory
            settings = {"temperature": s.temperature, "top-k": s.top_k, "top-p": s.top_p}
            settings["seed"] = pair.seed
        view = memory_pair_viz.pair_view(pair, settings) if pair is not None else None
        return view, memory_pair_viz.status_markdown(view)

    # -- public events --

    def step(self, prompt, mem_len, temperature, top_k, top_p, seed, state):
        """One character on each side (the pair started from the prompt first when the
        prompt or a setting changed): /pair_step."""
        sent = (mem_len, temperature, top_k, top_p, seed)
        state = self.service.ensure(state)
        with self.using(state, prompt, sent, steps=1) as pair:
            check_room(pair)
            pair.step()
            return (*self.views(pair), state)

    def generate(self, prompt, n, mem_len, temperature, top_k, top_p, seed, state):
        """n characters on each side from the prompt (a new pair: the same arguments give
        the same texts), streamed: /pair_generate."""
        sent = (mem_len, temperature, top_k, top_p, seed)
        state = self.service.ensure(state)
        with user_errors():  # a bad n: the page's message
            n = as_int("n", n, 1, MAX_GENERATE)
        sent_at = None
        for i in range(n):
            with self.using(state, prompt, sent, steps=1, fresh=i == 0) as pair:
                pair.step()
                last = i == n - 1
                if (
                    not last
                    and sent_at is not None
                    and time.perf_counter() - sent_at < STREAM_EVERY_S
                ):
                    continue
                shown = (*self.views(pair), state)
            sent_at = time.perf_counter()
            yield shown

    def reset(self, state):
        """Forget both texts (the prompt and settings stay on the page)."""
        if state is not None and not state.expired:
            with self.service.using(state, grows=False):
                self.forget(state)
        return (*self.views(None), state)

    # -- the page's events: the views packed (figures.packed) --

    def step_page(self, *inputs):
        view, status, state = self.step(*inputs)
        return figures.packed(view), status, state

    def generate_page(self, *inputs):
        for view, status, state in self.generate(*inputs):
            yield figures.packed(view), status, state

    def play(
        self, play_id, prompt, mem_len, temperature, top_k, top_p, seed, state, request: gr.Request
    ):
        """Play: Step after Step until paused, the newest views sent at most every
        PLAY_EVERY_S (the Watch tab's Play, for the pair: webapp/tabs/watch_play.py says
        why it is one stream). It ends when something else changed the pair."""
        sent = (mem_len, temperature, top_k, top_p, seed)
        control, visitor = self.control, visitor_of(request)
        play_id = as_play_id(play_id)
        state = self.service.ensure(state)
        control.start(visitor, play_id, None)
        own, unsent, sent_at, error = None, False, -PLAY_EVERY_S, None
        while control.goes_on(visitor, play_id):
            shown = None
            with self.using(state, prompt, sent, steps=1) as pair:
                if own is not None and own != (pair, pair.steps):
                    unsent = False  # a Step, Generate or Reset changed it: theirs to show
                    break
                try:
                    check_room(pair)
                except ValueError as e:
                    error = e
                    break
                pair.step()
                own, unsent = (pair, pair.steps), True
                if time.perf_counter() - sent_at >= PLAY_EVERY_S:
                    shown, unsent = self.views(pair), False
            if shown is not None:
                yield figures.packed(shown[0]), shown[1], state
                sent_at = time.perf_counter()
        if unsent:
            view, status = self.views(own[0])
            yield figures.packed(view), status, state
        if error is not None:
            with user_errors():
                raise error

    def stop(self, play_id, request: gr.Request) -> None:
        """Pause: the visitor's Plays up to ``play_id`` stop before their next step."""
        self.control.stop(visitor_of(request), as_play_id(play_id))

    def open_in_watch(self, temperature, top_k, top_p, seed, layer, head, state):
        """The Watch tab one Step before the parting point: its prompt the shared text, memory
        on at the pair's mem_len, where its last character looked, and the memory side's
        character left for the next Step to write (as the Score tab's Watch it)."""
        pair = state.pair if state is not None and not state.expired else None
        if pair is None or pair.parting is None:
            raise gr.Error("The two texts have not parted yet: Step, Play or Generate first.")
        p = pair.parting
        shared = "".join(pair.with_memory.pieces[: p.position])
        mem_len = pair.with_memory.mem_len
        with self.service.using(state, mem_len, steps=1):
            s = state.session
            sampling = (temperature, top_k, top_p, seed)
            self.service.apply_settings(s, Settings(True, mem_len, *sampling))
            self.service.start_from_prompt(s, shared, capture=True)
            # Watch's Step replays this token while the session holds the prompt alone.
            state.replay = (s.prompt, len(s.ids), p.memory_token)
            shown = current_views(state, layer, head)
        return (shared, True, mem_len, gr.Tabs(selected="watch"), *shown)

    @staticmethod
    def choose_example(choice):
        """An example: its prompt, settings, the words for it."""
        report = load_examples()
        if choice is None or report is None:
            return (gr.skip(),) * 8
        e = report["examples"][int(choice)]
        return (
            e["prompt"],
            report["mem_len"],
            report["temperature"],
            report["top_k"],
            report["top_p"],
            e["seed"],
            e["n"],
            example_guide(report, choice),
        )

    # -- the page --

    def build(self) -> dict:
        model = self.service.default_model
        mem_len = self.service.start_mem_len(model) if model else 0
        report = load_examples()
        ui = {}
        with gr.Row():
            with gr.Column(scale=4, min_width=300):
                choices = (
                    [(example_label(e), str(i)) for i, e in enumerate(report["examples"])]
                    if report
                    else []
                )
                ui["pair_example"] = gr.Dropdown(
                    choices,
                    value=None,
                    label=EXAMPLES_LABEL,
                    elem_id="pair_example",
                )
                ui["pair_guide"] = gr.Markdown(example_guide(report, None), elem_id="pair_guide")
                first = report["examples"][0]["prompt"] if report else "ROMEO:\n"
                ui["pair_prompt"] = gr.Textbox(
                    first, lines=3, max_lines=8, label="Prompt", elem_id="pair_prompt"
                )
                with gr.Row():
                    for name, variant in (
                        ("step", "secondary"),
                        ("play", "secondary"),
                        ("generate", "primary"),
                        ("reset", "stop"),
                    ):
                        ui[f"pair_{name}"] = gr.Button(
                            name.title(), variant=variant, elem_id=f"pair_{name}", min_width=70
                        )
                ui["pair_n"] = gr.Slider(
                    1,
                    MAX_GENERATE,
                    value=200,
                    step=1,
                    label="Characters to generate",
                    elem_id="pair_n",
                )
                with gr.Accordion("Memory and sampling", open=True):
                    ui["pair_mem_len"] = gr.Slider(
                        0,
                        MAX_MEM_LEN,
                        value=mem_len,
                        step=1,
                        label="mem_len (the left side)",
                        elem_id="pair_mem_len",
                    )
                    ui.update(sampling_controls("pair_", "seed (the shared draws)"))
                ui["pair_watch"] = gr.Button(
                    "Open the parting point in Watch", elem_id="pair_watch", size="sm"
                )
                gr.Markdown(HELP)
            with gr.Column(scale=7, min_width=340):
                ui["pair_status"] = page_view(
                    STATUS_TEMPLATE,
                    "mountStatus",
                    value=memory_pair_viz.status_markdown(None),
                    label="the two generations",
                    elem_id="pair_status",
                )
                ui["pair_view"] = page_view(
                    PAIR_TEMPLATE, "mountPair", label="memory on | off", elem_id="pair_view"
                )
        # Triggers the page never shows: the API's endpoints (the views as dicts) and Play's.
        ui["pair_step_api"] = gr.Button(visible=False, elem_id="pair_step_api")
        ui["pair_generate_api"] = gr.Button(visible=False, elem_id="pair_generate_api")
        ui["pair_play_run"] = gr.Button("Play", visible="hidden", elem_id="pair_play_run")
        ui["pair_play_stop"] = gr.Button("Pause", visible="hidden", elem_id="pair_play_stop")
        ui["pair_play_id"] = gr.Number(0, precision=0, visible=False, elem_id="pair_play_id")
        return ui

    def wire(self, ui: dict, state: gr.State) -> None:
        """/pair_step and /pair_generate public; the page's own events private."""
        settings = [ui[k] for k in SETTINGS]
        views = [ui["pair_view"], ui["pair_status"], state]
        step_inputs = [ui["pair_prompt"], *settings, state]
        gen_inputs = [ui["pair_prompt"], ui["pair_n"], *settings, state]
        model = dict(concurrency_id="model")  # with the Watch tab's Steps
        private = dict(api_visibility="private", show_progress="hidden")
        ui["pair_step_api"].click(self.step, step_inputs, views, api_name="pair_step", **model)
        ui["pair_generate_api"].click(
            self.generate, gen_inputs, views, api_name="pair_generate", **model
        )
        ui["pair_step"].click(
            self.step_page, step_inputs, views, trigger_mode="always_last", **private, **model
        )
        ui["pair_generate"].click(self.generate_page, gen_inputs, views, **private, **model)
        ui["pair_reset"].click(self.reset, [state], views, **private)
        ui["pair_play"].click(None, js="() => { TXL.pairTogglePlay(); }")
        with_id = dict(js="(...inputs) => TXL.pairWithPlayId(...inputs)", trigger_mode="multiple")
        ui["pair_play_run"].click(
            self.play,
            [ui["pair_play_id"], *step_inputs],
            views,
            concurrency_id="play",
            **with_id,
            **private,
        ).then(None, js="() => { TXL.pairPlayEnded(); }")
        ui["pair_play_stop"].click(
            self.stop, [ui["pair_play_id"]], None, concurrency_limit=None, **with_id, **private
        )
        sampling = [ui[k] for k in ("temperature", "top_k", "top_p", "seed", "layer", "head")]
        ui["pair_watch"].click(
            self.open_in_watch,
            [*sampling, state],
            [ui["prompt"], ui["memory"], ui["mem_len"], ui["tabs"], *outputs(ui, state)],
            **private,
        )
        ui["pair_example"].input(
            self.choose_example,
            [ui["pair_example"]],
            [ui["pair_prompt"], *settings, ui["pair_n"], ui["pair_guide"]],
            queue=False,
            **private,
        )


def check_room(pair: MemoryPair) -> None:
    """Step and Play stop at MAX_PAIR_STEPS: both texts go to the page at every step."""
    if pair.steps >= MAX_PAIR_STEPS:
        raise ValueError(
            f"the pair has written {pair.steps:,} characters on each side, the most it holds "
            f"({MAX_PAIR_STEPS:,}): Reset, or Generate to start over from the prompt"
        )
