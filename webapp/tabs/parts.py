"""Pieces of layout more than one tab uses (plain functions that build components; no tab
is imported here, and no handler lives here)."""

from __future__ import annotations

import gradio as gr

from .examples import TEMPERATURE, TOP_P  # the page's sampler


def page_view(template: str, *mounts: str, label: str, elem_id: str, value=None, **kwargs):
    """A view the page's JS draws (webapp/web/): a gr.HTML whose template never changes, so
    Gradio leaves its DOM alone, and whose ``TXL.<mount>`` callbacks redraw it from the
    value (a dict from the tab's view module)."""
    js = "; ".join(f"TXL.{mount}(element, props, watch)" for mount in mounts)
    return gr.HTML(
        value, html_template=template, js_on_load=js, label=label, elem_id=elem_id, **kwargs
    )


def mem_len_and_run(max_mem_len: int, mem_len: int, run: str, elem_id: str, min_width=90):
    """(slider, button) in one row: the mem_len a long job reads with, and its button."""
    with gr.Row():
        slider = gr.Slider(0, max_mem_len, value=mem_len, step=1, label="mem_len", min_width=160)
        button = gr.Button(run, variant="primary", elem_id=elem_id, min_width=min_width)
    return slider, button


def sampling_controls(prefix: str, seed_label: str) -> dict:
    """Temperature, top-k, top-p and seed in one row, as every tab that samples offers them:
    {prefix + name: component}, each with that name as its elem_id."""
    with gr.Row():
        return {
            f"{prefix}temperature": gr.Slider(
                0, 2, value=TEMPERATURE, step=0.05, label="temperature (0 = greedy)",
                elem_id=f"{prefix}temperature", min_width=120,
            ),
            f"{prefix}top_k": gr.Slider(
                0, 100, value=0, step=1, label="top-k (0 = off)", elem_id=f"{prefix}top_k",
                min_width=120,
            ),
            f"{prefix}top_p": gr.Slider(
                0.05, 1, value=TOP_P, step=0.05, label="top-p (1 = off)", elem_id=f"{prefix}top_p",
                min_width=120,
            ),
            f"{prefix}seed": gr.Number(
                0, precision=0, label=seed_label, elem_id=f"{prefix}seed", min_width=90
            ),
        }  # fmt: skip


def example_texts(box: gr.Textbox, texts: dict[str, str]) -> gr.Examples:
    """The example texts (label -> text) under a text box: a click fills the box."""
    return gr.Examples([[t] for t in texts.values()], inputs=[box], example_labels=list(texts))


def check_then_run(button: gr.Button, check, check_inputs, run, run_inputs, outputs, api_name):
    """A long job's button: a quick private check first (an input it refuses says why and
    leaves the outputs as they were; a good one stops this visitor's running job at once),
    then the public stream. A second click starts a new job beside the first, which the
    check has cancelled; the jobs pace themselves beside Steps (webapp/longwork.py), a few
    at once. Returns the stream's event, for what follows it."""
    return button.click(
        check,
        check_inputs,
        None,
        show_progress="hidden",
        api_visibility="private",
        concurrency_limit=None,  # a check of the inputs, quick: never waits for a slot
    ).success(
        run,
        run_inputs,
        outputs,
        api_name=api_name,
        trigger_mode="multiple",
        concurrency_limit=2,
    )
