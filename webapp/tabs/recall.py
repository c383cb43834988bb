"""The "How far back can it recall?" tab: a made-up speaker planted k characters back (after
a scene under way, or opening the text), its return read with memory, through the window
and in segments alone (txl/recall.py), as a chart over k that fills in as the rows are
read; **Watch it** takes one probe to the Watch tab, where one Step predicts the first
letter the probe scores.

    RecallTab(service).build() -> dict of components     .wire(ui, state)

The probe is txl/recall.py's, the chart and words webapp/recall_viz.py's; here the layout,
the checks, the streaming (a long job: webapp/longwork.py) and Watch it."""

from __future__ import annotations

import threading
import time
import weakref

import gradio as gr

from txl.recall import CUE, DISTANCES, check_recall, probe_text, recall_probe
from webapp.budget import note_heap_use
from webapp.inputs import as_int
from webapp.longwork import JobCancelled
from webapp.recall_viz import recall_figure, recall_markdown, recall_numbers
from webapp.serve import MAX_MEM_LEN, DemoService
from webapp.visitors import VisitorState, user_errors

from .examples import DEFAULT_NAME, DEFAULT_WATCH, RECALL_BEFORE, RECALL_FILLER
from .parts import check_then_run, mem_len_and_run

MAX_FILLER_CHARS = 20_000  # as the Score's text
# The text before the speaker is read whole: with it, the longest probe up to its first
# scored letter is still a prompt the Watch tab takes (MAX_PROMPT_CHARS, for Watch it).
MAX_BEFORE_CHARS = 16_000
HELP = f"""\
**How far back can it recall?** A speaker no play has enters a scene under way (the text
**Before the speaker enters**; by default the opening of *Hamlet*): `NAME:` on its own
line, one line of speech; then *k* characters of the filler, then the speaker returns: a
blank line and the first {CUE} letters of the name. Only a model that still sees the name
can finish it, so the bits per character of the rest of the name say whether it reached
back that far: **with memory** (segments of the training length, memory `mem_len`),
**through the window** (each character predicted from exactly the training length before
it, no memory), and **in segments alone**. The speech puts the name some 60 characters
further back than *k*: beyond the bundled model's window (64) at every *k*, where only
memory can bring it back. With nothing before the speaker the name opens the text, read
from states computed with no context at all: a harder case for a model trained on one long
stream, where a name comes inside text, hardly ever at its very start. **Watch it** opens
the Watch tab with the probe up to its first scored letter as the prompt: one **Step**
predicts that letter, and shows where it looked.
"""


class RecallTab:
    """The tab's handlers, on the shared service."""

    def __init__(self, service: DemoService):
        self.service = service

    def recall_check(self, name, filler, before, mem_len, state: VisitorState | None):
        """(model, name, filler, before, mem_len) of a probe that can run, or a message
        that says why not (the page runs this first, so that a refused probe leaves the
        chart as it was). The name is taken without the spaces around it; the text
        before the speaker enters, as it is (empty: the name opens the text)."""
        model = self.service.model_for(state)
        name, filler, before = str(name or "").strip(), str(filler or ""), str(before or "")
        if len(filler) > MAX_FILLER_CHARS:
            raise gr.Error(
                f"The filler is {len(filler):,} characters; the limit is {MAX_FILLER_CHARS:,} "
                f"(the probe uses its first {max(DISTANCES):,})."
            )
        if len(before) > MAX_BEFORE_CHARS:
            raise gr.Error(
                f"The text before the speaker enters is {len(before):,} characters; the limit "
                f"is {MAX_BEFORE_CHARS:,}."
            )
        with user_errors():
            mem_len = as_int("mem_len", mem_len, 0, self.service.mem_cap(model))
            check_recall(model, name, filler, DISTANCES, mem_len, before)
        return model, name, filler, before, mem_len

    def recall_click(self, name, filler, before, mem_len, state: VisitorState | None) -> None:
        """The page's Probe button, before ``recall``: check the inputs, then stop this
        session's running probe at once."""
        self.recall_check(name, filler, before, mem_len, state)
        if state is not None:
            self.service.traffic.cancel(recall_owner(state))

    def recall(self, name, filler, before, mem_len, state):
        """How far back can it recall? (txl/recall.py): the name planted k characters
        back after ``before`` for every k of DISTANCES, read with memory, through the
        window and in segments alone; (chart, sentence, numbers) after every row, as it is
        ready. A long job (webapp/longwork.py), paced segment by segment beside other
        visitors' Steps, cancelled by this session's next probe (not by its Score) or when
        the visitor leaves."""
        state = self.service.ensure(state)
        model, name, filler, before, mem_len = self.recall_check(
            name, filler, before, mem_len, state
        )
        window = model.config.tgt_len
        job = self.service.traffic.start_job(owner=recall_owner(state))
        rows, started = [], time.perf_counter()
        try:
            probe = recall_probe(
                model, name, filler, DISTANCES, mem_len, pace=job.turn, before=before
            )
            for row in probe:
                rows.append(row)
                took = time.perf_counter() - started
                done = len(rows) == len(DISTANCES)
                yield (
                    recall_figure(rows, mem_len, window),
                    recall_markdown(rows, mem_len, window, len(DISTANCES), took),
                    recall_numbers(rows, mem_len, window, took if done else None),
                    state,
                )
        except JobCancelled:  # this session's next probe replaced this one
            yield (gr.skip(),) * 3 + (state,)
        finally:
            job.close()
            note_heap_use()

    def recall_prompt(self, name, filler, before, distance, mem_len, state) -> tuple[str, int]:
        """Watch it: (prompt, mem_len) for the Watch tab: the probe of ``distance`` up to
        its first scored character, so that one Step with memory (``mem_len``) predicts
        that very character from the memory the probe's read had there."""
        _, name, filler, before, mem_len = self.recall_check(name, filler, before, mem_len, state)
        with user_errors():
            k = as_int("k", distance, 1, max(DISTANCES))
        text, start = probe_text(name, filler, k, before=before)
        return text[:start], mem_len

    # -- the page --

    def build(self) -> dict:
        """The name, the filler, the text before the speaker, mem_len and Probe; the chart,
        the probe to watch, the numbers."""
        model = self.service.default_model
        mem_len = self.service.start_mem_len(model) if model else 0
        ui = {}
        with gr.Row():
            with gr.Column(scale=4, min_width=300):
                ui["recall_name"] = gr.Textbox(
                    DEFAULT_NAME, label="A made-up speaker", max_lines=1, elem_id="recall_name"
                )
                ui["recall_filler"] = gr.Textbox(
                    RECALL_FILLER,
                    lines=8,
                    max_lines=16,
                    label=f"Filler: its first k characters (up to {max(DISTANCES):,}) go between",
                    elem_id="recall_filler",
                )
                ui["recall_before"] = gr.Textbox(
                    RECALL_BEFORE,
                    lines=4,
                    max_lines=10,
                    label="Before the speaker enters (empty: the name opens the text)",
                    elem_id="recall_before",
                )
                ui["recall_mem"], ui["recall"] = mem_len_and_run(
                    MAX_MEM_LEN, mem_len, "Probe", "recall_btn"
                )
                gr.Markdown(HELP)
            with gr.Column(scale=6, min_width=300):
                ui["recall_md"] = gr.Markdown(elem_id="recall_summary")
                ui["recall_plot"] = gr.Plot(
                    show_label=False, label="How far back can it recall?", elem_id="recall_plot"
                )
                with gr.Row():
                    ui["recall_pick"] = gr.Dropdown(
                        [(f"k = {k:,}", k) for k in DISTANCES],
                        value=DEFAULT_WATCH,
                        label="The probe to watch",
                        min_width=140,
                        elem_id="recall_pick",
                    )
                    ui["recall_watch"] = gr.Button("Watch it", elem_id="recall_watch", min_width=90)
                with gr.Accordion("The numbers (JSON)", open=False):
                    ui["recall_numbers"] = gr.JSON(label="recall", elem_id="recall_numbers")
        return ui

    def wire(self, ui: dict, state: gr.State) -> None:
        """Probe: a quick private check first (a probe that cannot run gives its message and
        leaves the chart as it was), then the public ``/recall`` stream. Watch it: the Watch
        tab, its prompt the chosen probe up to the first scored letter, memory on at the
        probe's mem_len. A Load of another model sets mem_len to that model's."""
        probe = [ui["recall_name"], ui["recall_filler"], ui["recall_before"]]
        inputs = [*probe, ui["recall_mem"], state]
        outputs = [ui["recall_plot"], ui["recall_md"], ui["recall_numbers"], state]
        check_then_run(
            ui["recall"], self.recall_click, inputs, self.recall, inputs, outputs, "recall"
        )

        def watch(name, filler, before, distance, mem_len, state):
            prompt, mem_len = self.recall_prompt(name, filler, before, distance, mem_len, state)
            return gr.Tabs(selected="watch"), prompt, True, mem_len

        ui["recall_watch"].click(
            watch,
            [*probe, ui["recall_pick"], ui["recall_mem"], state],
            [ui["tabs"], ui["prompt"], ui["memory"], ui["mem_len"]],
            api_visibility="private",
            show_progress="hidden",
        )

        def model_mem_len(state):
            return gr.skip() if state is None else self.service.start_mem_len(state.model)

        ui["model_info"].change(
            model_mem_len, [state], [ui["recall_mem"]], api_visibility="private", queue=False
        )


# Each session's key for its running probe, apart from the session itself (the key of its
# Score): Traffic keeps one job per key, so a probe and a Score do not cancel each other.
_RECALL_OWNERS: weakref.WeakKeyDictionary[VisitorState, object] = weakref.WeakKeyDictionary()
_RECALL_OWNERS_LOCK = threading.Lock()  # the click and the probe may ask at once


def recall_owner(state: VisitorState) -> object:
    """This visitor's key for its running probe."""
    with _RECALL_OWNERS_LOCK:
        return _RECALL_OWNERS.setdefault(state, object())
