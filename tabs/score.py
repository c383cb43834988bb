"""The "Does memory help?" tab: a text and a Score button; the text read three ways
(segments alone, a sliding window, memory) with the time each took; and how far back the
model reads. The work is ``Server.score_check`` / ``Server.score`` (txl/serve.py), a
generator whose stages stream in as they are ready: memory first, the slow sliding window
last with its progress (txl/longwork.py runs it beside other visitors' Steps)."""

from __future__ import annotations

import gradio as gr

from txl import viz
from txl.serve import MAX_MEM_LEN

from .examples import EXAMPLES, ROMEO_AND_JULIET


def build(app) -> dict:
    """The tab's components. The text box opens with the first example, so that the first
    click of Score works."""
    mem_len = app.start_mem_len(app.default_model) if app.default_model else 0
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
            with gr.Row():
                ui["score_mem"] = gr.Slider(
                    0, MAX_MEM_LEN, value=mem_len, step=1, label="mem_len", min_width=160
                )
                ui["score"] = gr.Button(
                    "Score", variant="primary", elem_id="score_btn", min_width=90
                )
            gr.Examples(
                [[text] for text in EXAMPLES.values()],
                inputs=[ui["score_text"]],
                example_labels=list(EXAMPLES),
            )
            gr.Markdown(viz.SCORE_HELP)
        with gr.Column(scale=6, min_width=300):
            ui["score_md"] = gr.Markdown(label="bits per character", elem_id="score_summary")
            ui["score_plot"] = gr.Plot(
                show_label=False, label="Surprisal per character", elem_id="score_plot"
            )
            ui["context_md"] = gr.Markdown(elem_id="context_summary")
            ui["context_plot"] = gr.Plot(
                show_label=False, label="How far back does it read?", elem_id="context_plot"
            )
            gr.Markdown(viz.CONTEXT_HELP)
            with gr.Accordion("The numbers (JSON)", open=False):
                ui["score_numbers"] = gr.JSON(label="scores", elem_id="score_numbers")
    return ui


def wire(app, ui: dict, state: gr.State) -> None:
    """Score: a quick private check first (a text it cannot score gives its message and
    leaves the charts as they were), then the public ``/score`` stream. A second click
    starts a new Score, which cancels this session's running one on the server."""
    outputs = [ui[k] for k in ("score_plot", "score_md", "score_numbers")]
    outputs += [ui["context_plot"], ui["context_md"], state]
    ui["score"].click(
        app.score_click,
        [ui["score_text"], state],
        None,
        show_progress="hidden",
        api_visibility="private",
        concurrency_limit=None,  # a check of the text, quick: never waits for a slot
    ).success(
        app.score,
        [ui["score_text"], ui["score_mem"], state],
        outputs,
        api_name="score",
        trigger_mode="multiple",
        # Scores pace themselves beside Steps (txl/longwork.py); a few may run at once.
        concurrency_limit=2,
    )
