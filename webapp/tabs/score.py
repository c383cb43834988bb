"""The "Does memory help?" tab: a text and a Score button; the text read three ways
(segments alone, a sliding window, memory) with the time each took; where memory mattered
(the text shaded by the bits memory saved over the window, the five characters it saved
the most on, each with **Watch it**); and how far back the model reads. The work is
``Server.score_check`` / ``Server.score`` (webapp/serve.py), a generator whose stages stream
in as they are ready: memory first, the slow sliding window last with its progress
(webapp/longwork.py runs it beside other visitors' Steps); then ``Server.score_moments``."""

from __future__ import annotations

import gradio as gr

from webapp import viz
from webapp.serve import MAX_MEM_LEN

from .examples import EXAMPLES, ROMEO_AND_JULIET

MOMENTS_TEMPLATE = (
    '<div class="txl-moments"><div class="txl-empty">Score a text: when its sliding window '
    "is done, its characters are shaded here by the bits memory saved on them.</div>"
    '<div class="txl-mom-head"></div><div class="txl-mom-text"></div>'
    '<ol class="txl-mom-list"></ol><div class="txl-tip"></div></div>'
)


def build(app) -> dict:
    """The tab's components. The text box opens with the first example, so that the first
    click of Score works."""
    mem_len = app.start_mem_len(app.default_model) if app.default_model else 0
    window = app.default_model.config.tgt_len if app.default_model else "tgt_len"
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
            ui["moments"] = gr.HTML(
                None,
                html_template=MOMENTS_TEMPLATE,
                js_on_load="TXL.mountMoments(element, props, watch)",
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
                ui["watch_it"] = gr.Button("Watch it", scale=1, min_width=90, elem_id="watch_it")
            gr.Markdown(viz.MOMENTS_HELP.format(unit="character", window=window))
            ui["context_md"] = gr.Markdown(elem_id="context_summary")
            ui["context_plot"] = gr.Plot(
                show_label=False, label="How far back does it read?", elem_id="context_plot"
            )
            gr.Markdown(viz.CONTEXT_HELP)
            with gr.Accordion("The numbers (JSON)", open=False):
                ui["score_numbers"] = gr.JSON(label="scores", elem_id="score_numbers")
    return ui


def wire(app, ui: dict, state: gr.State, views: list) -> None:
    """Score: a quick private check first (a text it cannot score gives its message and
    leaves the charts as they were), then the public ``/score`` stream, then (private)
    where memory mattered. A second click starts a new Score, which cancels this
    session's running one on the server. Watch it: the Watch tab, its prompt the text up
    to the chosen moment, memory on at the Score's mem_len, the session started on it
    (``views``: the Watch tab's outputs, as Step returns them)."""
    outputs = [ui[k] for k in ("score_plot", "score_md", "score_numbers")]
    outputs += [ui["context_plot"], ui["context_md"], state]
    private = dict(api_visibility="private", show_progress="hidden")
    sampling = [ui[k] for k in ("temperature", "top_k", "top_p", "seed", "layer", "head")]

    def watch_it(position, temperature, top_k, top_p, seed, layer, head, state):
        """The Watch tab, started on the text before the moment (Server.watch_moment):
        where the model looked for it now, and one Step writes it."""
        state = app.ensure(state)
        prompt = app.watch_moment(state, position, (temperature, top_k, top_p, seed))
        with app.using(state, grows=False):
            shown = app.all_views(state, layer, head)
        return (prompt, True, state.session.mem_len, gr.Tabs(selected="watch"), *shown)

    ui["watch_it"].click(
        watch_it,
        [ui["moment"], *sampling, state],
        [ui["prompt"], ui["memory"], ui["mem_len"], ui["tabs"], *views],
        **private,
    )
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
        # Scores pace themselves beside Steps (webapp/longwork.py); a few may run at once.
        concurrency_limit=2,
    ).success(app.score_moments, [state], [ui["moments"], ui["moment"]], **private)
