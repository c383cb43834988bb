"""The "Does memory help?" tab: a text and a Score button; the text read three ways
(segments alone, a sliding window, memory) with the time each took; where memory mattered
(the text shaded by the bits memory saved over the window, the five characters it saved
the most on, each with **Watch it**); and how far back the model reads.

    ScoreTab(service).build() -> dict of components     .wire(ui, state)

``score`` is a generator whose stages stream in as they are ready: memory first, the slow
sliding window last with its progress (webapp/longwork.py runs it beside other visitors'
Steps); then ``score_moments``. The work is ``txl.scoring.score_stages``, the
views webapp/score_viz.py; **Watch it** lands on the Watch tab with its views
(webapp/tabs/watch_views.py).
"""

from __future__ import annotations

import time

import gradio as gr

from txl.scoring import CONTEXT_SWEEP_LENGTHS, score_stages
from webapp import score_viz
from webapp.budget import note_heap_use
from webapp.inputs import as_int
from webapp.longwork import JobCancelled
from webapp.serve import MAX_MEM_LEN, DemoService, Settings
from webapp.visitors import VisitorState, user_errors

from .examples import EXAMPLES, ROMEO_AND_JULIET
from .parts import check_then_run, example_texts, mem_len_and_run, page_view
from .watch_views import current_views, outputs

MAX_SCORE_CHARS = 20_000
MAX_SLIDING_CHARS = 5_000  # the score's sliding window runs the model once per character
SCORE_STREAM_EVERY_S = 0.25  # the sliding window's progress is sent at most this often
MOMENTS_TEMPLATE = (
    '<div class="txl-moments"><div class="txl-empty">Score a text: when its sliding window '
    "is done, its characters are shaded here by the bits memory saved on them.</div>"
    '<div class="txl-mom-head"></div><div class="txl-mom-text"></div>'
    '<ol class="txl-mom-list"></ol><div class="txl-tip"></div></div>'
)


class ScoreTab:
    """The tab's handlers, on the shared service."""

    def __init__(self, service: DemoService):
        self.service = service

    def score_check(self, text, state: VisitorState | None) -> None:
        """Refuse a text the score cannot use, with a message that says why (the page runs
        this first, so that a refused text leaves the charts as they were)."""
        text = text or ""
        if len(text) > MAX_SCORE_CHARS:
            raise gr.Error(
                f"The text is {len(text):,} characters; the limit is {MAX_SCORE_CHARS:,}."
            )
        if token_count(self.service.model_for(state), text) < 2:
            raise gr.Error("Nothing to score: paste at least two characters the model knows.")

    def score_click(self, text, state: VisitorState | None) -> None:
        """The page's Score button, before ``score``: check the text, then stop this
        session's running Score at once (not when the new one gets its turn in the queue)."""
        self.score_check(text, state)
        if state is not None:
            self.service.traffic.cancel(state)

    def score(self, text, mem_len, state):
        """The text read three ways (segments alone, a sliding window of the segment
        length, memory) and with memories of 0 to 1,024, in stages as they are ready:
        memory and segments alone (curves, bpc, times, words) first, then the
        memory-length sweep, then the sliding window's progress and, at the end, all five
        outputs complete. A generator: Gradio streams each stage, gradio_client's
        ``predict`` returns the last. The work runs as a long job (webapp/longwork.py): two
        threads when the cores are free and two pay, paused for other visitors' Steps,
        cancelled by this session's next Score or when the visitor leaves."""
        self.score_check(text, state)  # before ensure: the model is the same either way
        state = self.service.ensure(state)
        text = text or ""
        with user_errors():
            mem_len = as_int("mem_len", mem_len, 0, MAX_MEM_LEN)
            mem_len = min(mem_len, self.service.mem_cap(state.model))
        model = state.model  # the visitor's own text and memory are not touched
        sliding = len(text) <= MAX_SLIDING_CHARS
        stages = 3 if sliding else 2  # the reads, the sweep, the sliding window
        unit, seg_len = model.tokenizer.unit, model.config.tgt_len
        job = self.service.traffic.start_job(owner=state)
        sent = 0.0
        skip = gr.skip()
        try:
            # Where the Score is, from its start: the stage, what it has done, what is left.
            reading = score_viz.reading_progress_markdown(token_count(model, text), stages, unit)
            yield skip, reading, skip, skip, skip, state
            work = score_stages(model, text, seg_len, mem_len, sliding=sliding, pace=job.turn)
            for stage in work:
                result, sweep = stage.result, stage.sweep
                summary = score_viz.score_markdown(result, seg_len, mem_len, unit=unit)
                if stage.kind == "done":
                    moments = result.moments()  # None without the sliding window
                    state.scored = result if moments is not None else None
                    if not sliding:
                        summary += (
                            f"\n\n(The sliding window is computed for texts of up to "
                            f"{MAX_SLIDING_CHARS:,} characters: it runs the model once per "
                            "character.)"
                        )
                    yield (
                        score_viz.surprisal_figure_from_result(result),
                        summary,
                        score_viz.score_numbers(result, sweep, moments),
                        score_viz.context_figure(sweep, unit=unit, sliding_bpc=result.bpc_sliding),
                        score_viz.context_markdown(sweep, unit=unit),
                        state,
                    )
                    return
                if stage.kind == "reads":
                    summary += "\n\n" + score_viz.sweep_progress_markdown(
                        result, CONTEXT_SWEEP_LENGTHS, stages, unit
                    )
                elif sliding:
                    summary += "\n\n" + score_viz.sliding_progress_markdown(
                        stage.done, stage.total, stage.seconds_left, seg_len, unit, stages
                    )
                if stage.kind == "reads":
                    sent = time.monotonic()
                    yield (
                        score_viz.surprisal_figure_from_result(result),
                        summary,
                        score_viz.score_numbers(result),
                        skip,
                        score_viz.SWEEP_PENDING,
                        state,
                    )
                elif stage.kind == "sweep":
                    sent = time.monotonic()
                    yield (
                        skip,
                        summary,
                        score_viz.score_numbers(result, sweep),
                        score_viz.context_figure(sweep, unit=unit),
                        score_viz.context_markdown(sweep, unit=unit),
                        state,
                    )
                elif time.monotonic() - sent >= SCORE_STREAM_EVERY_S:  # sliding progress
                    sent = time.monotonic()
                    yield skip, summary, skip, skip, skip, state
        except JobCancelled:
            # This session's next Score replaced this one: leave the page to it (Gradio
            # repeats the last yield when a generator ends).
            yield (gr.skip(),) * 5 + (state,)
        finally:
            job.close()
            note_heap_use()

    # -- the recall probe: long work, streamed --

    def score_moments(self, state: VisitorState | None):
        """After a Score: where memory mattered (webapp.score_viz.moments_view: the text shaded by
        the bits memory saved over the sliding window, the five moments) and the Watch-it
        choices, of this session's last Score with a sliding window (None and no choices
        when there is none: a text too long for the window, or no Score yet)."""
        scored = state.scored if state is not None and not state.expired else None
        if scored is None:
            return None, gr.Dropdown(choices=[], value=None, interactive=False)
        moments, unit = scored.moments(), state.model.tokenizer.unit
        choices = score_viz.moment_choices(moments, unit)
        return score_viz.moments_view(scored, moments, unit), gr.Dropdown(
            choices=choices, value=choices[0][1] if choices else None, interactive=True
        )

    def moment_prompt(self, state: VisitorState | None, position) -> tuple[str, int, int]:
        """(prompt, mem_len, token) that make a Watch-tab Step predict the token at
        ``position`` of this session's last Score as the Score did: the text before it (as
        scored), read in segments over a memory of the Score's mem_len (Session.feed reads
        a prompt as the Score reads the text, so the pending prediction is the Score's),
        and the id of that token."""
        scored = state.scored if state is not None and not state.expired else None
        if scored is None:
            raise gr.Error(
                f"Score a text first (up to {MAX_SLIDING_CHARS:,} characters: its sliding "
                "window finds the moments), then pick a moment to watch."
            )
        pieces = scored.pieces
        try:
            position = as_int("moment", position, 1, len(pieces) - 1)
        except ValueError as e:
            raise gr.Error(f"Pick a moment of the last Score: {e}") from None
        token = state.model.tokenizer.encode_known("".join(pieces[: position + 1]))[0][-1]
        return "".join(pieces[:position]), scored.mem_len, token

    def watch_moment(self, state: VisitorState, position, sampling: tuple) -> str:
        """Watch it: this session started on the text before the moment at ``position`` of
        its last Score, memory on at the Score's mem_len (``settings``: temperature,
        top_k, top_p, seed, as apply_settings takes them), the attention of the prompt's
        last token captured (where the model looked for the moment), and the moment's
        own token left for the next Step to write. Returns the prompt."""
        prompt, mem_len, token = self.moment_prompt(state, position)
        with self.service.using(state, mem_len):
            s = state.session
            self.service.apply_settings(s, Settings(True, mem_len, *sampling))
            self.service.start_from_prompt(s, prompt, capture=True)
            state.replay, state.given = (s.prompt, len(s.ids), token), None
        return prompt

    # -- the page --

    def build(self) -> dict:
        """The tab's components. The text box opens with the first example, so that the first
        click of Score works."""
        model = self.service.default_model
        mem_len = self.service.start_mem_len(model) if model else 0
        window = model.config.tgt_len if model else "tgt_len"
        ui = {}
        with gr.Row():
            with gr.Column(scale=4, min_width=300):
                ui["score_text"] = gr.Textbox(
                    ROMEO_AND_JULIET,
                    lines=10,
                    max_lines=20,
                    label="Text to score",
                    elem_id="score_text",
                )
                ui["score_mem"], ui["score"] = mem_len_and_run(
                    MAX_MEM_LEN, mem_len, "Score", "score_btn"
                )
                example_texts(ui["score_text"], EXAMPLES)
                gr.Markdown(SCORE_HELP)
            with gr.Column(scale=6, min_width=300):
                ui["score_md"] = gr.Markdown(label="bits per character", elem_id="score_summary")
                ui["score_plot"] = gr.Plot(
                    show_label=False, label="Surprisal per character", elem_id="score_plot"
                )
                ui["moments"] = page_view(
                    MOMENTS_TEMPLATE,
                    "mountMoments",
                    label="Where memory mattered",
                    elem_id="moments",
                )
                with gr.Row(equal_height=True):
                    ui["moment"] = gr.Dropdown(
                        choices=[],
                        value=None,
                        label="A moment to watch",
                        interactive=False,
                        scale=4,
                        elem_id="moment",
                    )
                    ui["watch_it"] = gr.Button(
                        "Watch it", scale=1, min_width=90, elem_id="watch_it"
                    )
                gr.Markdown(MOMENTS_HELP.format(unit="character", window=window))
                ui["context_md"] = gr.Markdown(elem_id="context_summary")
                ui["context_plot"] = gr.Plot(
                    show_label=False, label="How far back does it read?", elem_id="context_plot"
                )
                gr.Markdown(CONTEXT_HELP)
                with gr.Accordion("The numbers (JSON)", open=False):
                    ui["score_numbers"] = gr.JSON(label="scores", elem_id="score_numbers")
        return ui

    def watch_it(self, position, temperature, top_k, top_p, seed, layer, head, state):
        """Watch it: the Watch tab, started on the text before the moment (watch_moment):
        where the model looked for it now, and one Step writes it."""
        state = self.service.ensure(state)
        prompt = self.watch_moment(state, position, (temperature, top_k, top_p, seed))
        with self.service.using(state, grows=False):
            shown = current_views(state, layer, head)
        return (prompt, True, state.session.mem_len, gr.Tabs(selected="watch"), *shown)

    def wire(self, ui: dict, state: gr.State) -> None:
        """Score: a quick private check first (a text it cannot score gives its message and
        leaves the charts as they were), then the public ``/score`` stream, then (private)
        where memory mattered. A second click starts a new Score, which cancels this
        session's running one on the server. Watch it: the Watch tab, its prompt the text up
        to the chosen moment, memory on at the Score's mem_len, the session started on it
        (the Watch tab's outputs, as Step returns them)."""
        score_outputs = [ui[k] for k in ("score_plot", "score_md", "score_numbers")]
        score_outputs += [ui["context_plot"], ui["context_md"], state]
        private = dict(api_visibility="private", show_progress="hidden")
        sampling = [ui[k] for k in ("temperature", "top_k", "top_p", "seed", "layer", "head")]
        ui["watch_it"].click(
            self.watch_it,
            [ui["moment"], *sampling, state],
            [ui["prompt"], ui["memory"], ui["mem_len"], ui["tabs"], *outputs(ui, state)],
            **private,
        )
        check = [ui["score_text"], state]
        score = [ui["score_text"], ui["score_mem"], state]
        stream = check_then_run(
            ui["score"], self.score_click, check, self.score, score, score_outputs, "score"
        )
        stream.success(self.score_moments, [state], [ui["moments"], ui["moment"]], **private)


def token_count(model, text: str) -> int:
    """The tokens of ``text`` a Score reads (the tokenizer's one unknown-character rule)."""
    return len(model.tokenizer.encode_known(text)[0])


SCORE_HELP = """\
**Three ways to read a long text with a model trained on segments of a fixed length**
(64 characters for the bundled Shakespeare model).

- **Segments read alone** (orange): cut the text into segments and read each one with
  nothing before it. Cheap, but the first characters of every segment are guessed blind:
  see the curve jump up after each dotted line. The paper calls this *context
  fragmentation*.
- **Sliding window** (green): for every character, run the model again on exactly the
  segment length of characters before it. The best a model without memory can do, but
  every character costs a whole forward pass over the window.
- **Memory** (blue, Transformer-XL): read the segments in order, and let each one also look
  at the hidden states the model already computed for the text before it, without
  recomputing them.

Memory beats the segments read alone (the fragmentation is gone) *and* does about as well
as the sliding window, or better (it sees further back than one segment), at a fraction
of the time: the time of each way is in the legend.
"""

CONTEXT_HELP = """\
**How far back does it read?** The same text scored with memories of different lengths
(0 = segments read alone). The curve falls while the extra memory still holds something
useful and flattens once it does not. The red line marks the **effective context**: the
shortest memory whose bits per character are within 1 % of the best. Memory costs time and
space in proportion to its length, so there is no point keeping more than the model uses.
The paper measures the same idea as *relative effective context length* (its Section 4.2).
"""

MOMENTS_HELP = """\
**Where memory mattered.** When the sliding window is done, the text is shaded {unit} by
{unit} by the bits memory saved over the window of the last {window} {unit}s (blue: memory
made the {unit} likelier; red: less likely; hover for both probabilities), and the five
{unit}s it saved the most on are listed in their context. Pick one and press **Watch it**:
the Watch tab opens on the text up to that {unit} as the prompt, memory on at this
mem_len, and shows where the model looked to predict it (the attention of the prompt's
last {unit}); one **Step** then writes that very {unit}, with its prediction with memory
and without: the numbers listed here.
"""
