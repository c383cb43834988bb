"""The "How far back can it recall?" tab: a made-up speaker planted k characters back, its
return read with memory, through the window and in segments alone (txl/recall.py), as a
chart over k that fills in as the rows are read; **Watch it** takes one probe to the Watch
tab, where one Step predicts the first letter the probe scores. The work is
``Server.recall_check`` / ``Server.recall`` / ``Server.recall_prompt`` (webapp/serve.py)."""

from __future__ import annotations

import gradio as gr

from txl.recall import CUE, DISTANCES
from webapp.serve import MAX_MEM_LEN

from .examples import RECALL_FILLER

DEFAULT_NAME = "ZANTHOR"  # no play has him: only a recall can finish the name
# Watch it opens on 128: the name then lies beyond the window (64) but inside the memory
# (128) of the bundled model, where only memory can see it.
DEFAULT_WATCH = 128

HELP = f"""\
**How far back can it recall?** A speaker no play has is planted (`NAME:` on its own line,
one line of speech), then *k* characters of the filler, then the speaker returns: a blank
line and the first {CUE} letters of the name. Only a model that still sees the name can
finish it, so the bits per character of the rest of the name say whether it reached back
that far: **with memory** (segments of the training length, memory `mem_len`), **through
the window** (each character predicted from exactly the training length before it, no
memory), and **in segments alone**. The speech puts the name some 60 characters further
back than *k*: beyond the bundled model's window (64) at every *k*, where only memory can
bring it back. **Watch it** opens the Watch tab with the probe up to its
first scored letter as the prompt: one **Step** predicts that letter, and shows where it
looked.
"""


def build(app) -> dict:
    mem_len = app.start_mem_len(app.default_model) if app.default_model else 0
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
            with gr.Row():
                ui["recall_mem"] = gr.Slider(
                    0, MAX_MEM_LEN, value=mem_len, step=1, label="mem_len", min_width=160
                )
                ui["recall"] = gr.Button(
                    "Probe", variant="primary", elem_id="recall_btn", min_width=90
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


def wire(app, ui: dict, state: gr.State) -> None:
    """Probe: a quick private check first (a probe that cannot run gives its message and
    leaves the chart as it was), then the public ``/recall`` stream. Watch it: the Watch
    tab, its prompt the chosen probe up to the first scored letter, memory on at the
    probe's mem_len. A Load of another model sets mem_len to that model's."""
    inputs = [ui["recall_name"], ui["recall_filler"], ui["recall_mem"], state]
    ui["recall"].click(
        app.recall_click,
        inputs,
        None,
        show_progress="hidden",
        api_visibility="private",
        concurrency_limit=None,  # a check of the inputs, quick: never waits for a slot
    ).success(
        app.recall,
        inputs,
        [ui["recall_plot"], ui["recall_md"], ui["recall_numbers"], state],
        api_name="recall",
        trigger_mode="multiple",
        concurrency_limit=2,  # probes pace themselves beside Steps (webapp/longwork.py)
    )

    def watch(name, filler, distance, mem_len, state):
        prompt, mem_len = app.recall_prompt(name, filler, distance, mem_len, state)
        return gr.Tabs(selected="watch"), prompt, True, mem_len

    ui["recall_watch"].click(
        watch,
        [ui["recall_name"], ui["recall_filler"], ui["recall_pick"], ui["recall_mem"], state],
        [ui["tabs"], ui["prompt"], ui["memory"], ui["mem_len"]],
        api_visibility="private",
        show_progress="hidden",
    )

    def model_mem_len(state):
        return gr.skip() if state is None else app.start_mem_len(state.model)

    ui["model_info"].change(
        model_mem_len, [state], [ui["recall_mem"]], api_visibility="private", queue=False
    )
