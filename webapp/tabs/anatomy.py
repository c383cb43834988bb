"""The "Inside the attention" tab: a text read in segments over a memory, from an empty
memory, and what the heads did, by distance: the paper's Figure 5 (each head's average
attention) and Figure 7 (the terms (a), (b), (d) each softmaxed alone), live on this model.

    AnatomyTab(service).build(examples) -> dict of components     .wire(ui, state)

The numbers come from txl.anatomy, the figures and words from webapp.anatomy_viz; here only
the layout, the input checks and the streaming. Long work follows the Score tab's rules:
progress while the text is read, Figure 5 first, then Figure 7; pressing the button again
stops the old job (at its next segment); empty or bad input says why and leaves the
figures as they were.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from txl import anatomy
from webapp import anatomy_viz
from webapp.inputs import as_int
from webapp.serve import DemoService

from .parts import example_texts, mem_len_and_run

MAX_CHARS = 5_000  # ~10 s for the bundled model at mem_len 128 on the shared 2-core machine
MAX_MEM_LEN = 512  # docs/figures.md's figures: 128 (as trained) and 512
ALL_HEADS = "all heads"
STAGE_EVERY_S = 0.5  # while reading, a progress stage at most this often
KEEP_FILES_S = 600  # the PNG and JSON files a run writes are removed after ten minutes
FIGURES = {
    "anatomy_fig5": "Figure 5: average attention by distance",
    "anatomy_fig7": "Figure 7: terms (a), (b), (d), each softmaxed alone",
}


@dataclass
class AnatomyState:
    """One browser session's tab: the job that runs (a newer click stops an older one)
    and the last profiles, redrawn without recomputing when the order or head changes."""

    job: int = 0
    result: anatomy.Profiles | None = None
    files: dict = field(default_factory=dict)  # name -> path of the last run's files


HELP = """\
**What this shows.** The text is read as the model reads it: segments of the model's
segment length, each over a memory of the last `mem_len` positions, starting empty. Every
head's attention weights are then averaged over all the queries by **how far back** each
key is (0 = the query itself). **Figure 5**: one row per head (`layer.head`); bright
cells are distances that head reads. **Figure 7**: the same for three of the four terms
that make a relative-attention score, each *softmaxed alone*: (a) content q·k, (b)
content-dependent position q·W_R R(i−j), (d) global position bias v·W_R R(i−j); (c),
u·k, a global bias on what each key is, carries no distance, and the paper leaves it out
too. Step in "Watch the memory" with one layer and one head chosen to see all four terms of a
single prediction. The PNGs download from each figure; `/anatomy` returns the numbers.
"""


class AnatomyTab:
    """The tab's layout and wiring, on the shared service; its handlers are ``read`` and
    ``draw`` below (functions of the service, tested without a page)."""

    def __init__(self, service: DemoService):
        self.service = service

    def build(self, examples: dict[str, str]) -> dict:
        """Text (an example filled in, so that the first click works), mem_len, the button;
        the words, Figure 5 and Figure 7, their order and the head of Figure 7."""
        anatomy_viz.load_matplotlib()
        model = self.service.default_model
        mem_len = min(MAX_MEM_LEN, self.service.start_mem_len(model)) if model else 128
        ui = {}
        with gr.Row():
            with gr.Column(scale=4, min_width=300):
                ui["anatomy_text"] = gr.Textbox(
                    next(iter(examples.values()), ""),
                    lines=10,
                    max_lines=20,
                    label=f"Text (up to {MAX_CHARS:,} characters)",
                    elem_id="anatomy_text",
                )
                ui["anatomy_mem"], ui["anatomy_run"] = mem_len_and_run(
                    MAX_MEM_LEN, mem_len, "Look inside", "anatomy_run", min_width=110
                )
                ui["anatomy_use_text"] = gr.Button(
                    "Use my text from “Watch the memory”", size="sm", elem_id="anatomy_use_text"
                )
                example_texts(ui["anatomy_text"], examples)
                gr.Markdown(HELP)
            with gr.Column(scale=6, min_width=340):
                ui["anatomy_status"] = gr.Markdown(
                    "Press **Look inside** to read the text.", elem_id="anatomy_status"
                )
                ui["anatomy_md"] = gr.Markdown(elem_id="anatomy_words")
                with gr.Row():
                    ui["anatomy_order"] = gr.Dropdown(
                        choices=[(label, key) for key, label in anatomy_viz.ORDERS.items()],
                        value="layer",
                        label="Rows (heads) ordered by",
                        min_width=160,
                    )
                    ui["anatomy_head"] = gr.Dropdown(
                        **head_choices(model), label="Figure 7: heads", min_width=140
                    )
                for name, label in FIGURES.items():  # PNG files: the download button saves them
                    ui[name] = gr.Image(
                        type="filepath",
                        format="png",
                        label=label,
                        show_label=False,
                        buttons=["download", "fullscreen"],
                        elem_id=name,
                    )
                ui["anatomy_file"] = gr.File(label="the numbers (JSON)", elem_id="anatomy_file")
                ui["anatomy_numbers"] = gr.JSON(visible=False, elem_id="anatomy_numbers")
        return ui

    def wire(self, ui: dict, state: gr.State) -> None:
        # One per browser session (Gradio copies the value for each), there before the first
        # run: a second click finds the job number the first one is checking.
        tab = gr.State(AnatomyState())
        outputs = [ui[k] for k in ("anatomy_status", "anatomy_md", "anatomy_fig5", "anatomy_fig7")]
        outputs += [ui["anatomy_numbers"], ui["anatomy_file"], ui["anatomy_head"], tab]

        def run(text, mem_len, order, head, state, tab, progress=gr.Progress()):  # noqa: B008
            yield from read(self.service, text, mem_len, order, head, state, tab, progress)

        def redraw(order, head, tab):  # the order changes both figures
            if tab is None or tab.result is None:
                return gr.skip(), gr.skip()
            paths = draw(self.service, tab, order, parse_head(head))
            return paths["fig5"], paths["fig7"]

        def redraw_figure_7(order, head, tab):  # the head changes Figure 7 only
            if tab is None or tab.result is None:
                return gr.skip()
            return draw(self.service, tab, order, parse_head(head), ("fig7",))["fig7"]

        def use_text(state):
            text = state.session.text if state is not None and not state.expired else ""
            if not text:
                gr.Warning(
                    "Nothing written yet in “Watch the memory”: Step or Generate there first."
                )
                return gr.skip()
            return text[-MAX_CHARS:]

        ui["anatomy_run"].click(
            run,
            [ui["anatomy_text"], ui["anatomy_mem"], ui["anatomy_order"], ui["anatomy_head"]]
            + [state, tab],
            outputs,
            api_name="anatomy",
            # A second click runs beside the first, which stops at its next segment.
            trigger_mode="multiple",
            concurrency_limit=4,
            concurrency_id="anatomy",
        )
        for event, fn, figures in (
            (ui["anatomy_order"].change, redraw, ["anatomy_fig5", "anatomy_fig7"]),
            (ui["anatomy_head"].change, redraw_figure_7, ["anatomy_fig7"]),
        ):
            event(
                fn,
                [ui["anatomy_order"], ui["anatomy_head"], tab],
                [ui[name] for name in figures],
                trigger_mode="always_last",
                api_visibility="private",
            )
        ui["anatomy_use_text"].click(
            use_text, [state], [ui["anatomy_text"]], api_visibility="private"
        )


def head_choices(model) -> dict:
    c = model.config if model is not None else None
    heads = [f"L{layer}.{h}" for layer in range(c.n_layer) for h in range(c.n_head)] if c else []
    return dict(choices=[ALL_HEADS] + heads, value=ALL_HEADS)


def parse_head(choice) -> tuple[int, int] | None:
    """'L3.5' -> (3, 5); anything else (all heads) -> None."""
    try:
        layer, head = str(choice or "").removeprefix("L").split(".")
        return int(layer), int(head)
    except ValueError:
        return None


def read(service, text, mem_len, order, head, state, tab: AnatomyState | None, progress):
    """The handler of /anatomy: check, read the text segment by segment (progress), then
    Figure 5 and the words, then Figure 7. A newer click on the same tab stops it."""
    text = text or ""
    model = state.model if state is not None and not state.expired else service.default_model
    problem = None
    try:
        mem_len = as_int("mem_len", mem_len, 0, MAX_MEM_LEN)
    except ValueError as e:
        problem = str(e)
    if model is None:
        problem = f"No model is loaded ({service.load_error})."
    elif not text.strip():
        problem = "The text is empty: paste one, pick an example, or use your text."
    elif len(text) > MAX_CHARS:
        problem = (
            f"The text is {len(text):,} characters; this tab reads at most {MAX_CHARS:,} "
            f"(about 10 s here). Cut it, or keep its last {MAX_CHARS:,}."
        )
    ids = [] if problem else model.tokenizer.encode(text, errors="ignore")
    if not problem and not ids:
        problem = "None of these characters is in the model's vocabulary: nothing to read."
    if problem:  # the message; the figures stay as they were
        gr.Warning(problem)
        yield (f"⚠️ {problem}", *[gr.skip()] * 6, tab)
        return

    tab = tab or AnatomyState()
    tab.job += 1
    job = tab.job
    unit = model.tokenizer.unit
    result, shown = None, time.perf_counter()
    for result in anatomy.iter_profiles(model, ids, mem_len):
        if tab.job != job:
            return  # a newer click on this tab took over
        progress((result.n_queries, result.n_tokens), desc=f"reading {unit}s", unit=unit)
        if time.perf_counter() - shown > STAGE_EVERY_S and not result.done:
            # A stage now and then: where it is, and a point where Gradio stops the job
            # when the visitor has left (it checks between yields).
            shown = time.perf_counter()
            where = f"Reading… {result.n_queries:,} of {result.n_tokens:,} {unit}s"
            yield f"{where} ({result.seconds:.1f} s)", *[gr.skip()] * 6, tab
    tab.result = result
    words = anatomy_viz.anatomy_markdown(result, unit)
    heads = gr.Dropdown(**head_choices(model))  # the session's model may have other heads
    started = time.perf_counter()
    fig5 = draw(service, tab, order, None, ("fig5",))["fig5"]
    reading = anatomy_viz.reading_sentence(result, unit).removesuffix(".")
    yield f"{reading}; drawing Figure 7…", words, fig5, *[gr.skip()] * 3, heads, tab
    if tab.job != job:
        return
    fig7 = draw(service, tab, order, parse_head(head), ("fig7",))["fig7"]
    numbers = save_numbers(service, tab)
    status = (
        f"{reading}, the four terms included; figures drawn in "
        f"{time.perf_counter() - started:.1f} s."
    )
    yield status, words, fig5, fig7, numbers, tab.files["json"], heads, tab


def draw(service, tab: AnatomyState, order, head, figures=("fig5", "fig7")) -> dict:
    """Figures 5 and 7 (or those named) of the tab's last result as PNG files: name ->
    path. ``head``: (layer, head) for Figure 7, or None for all heads."""
    result = tab.result
    if order not in anatomy_viz.ORDERS:
        order = "layer"
    if head is not None and not (
        head[0] < result.attention.shape[0] and head[1] < result.attention.shape[1]
    ):
        head = None
    title = f"{result.n_tokens:,} tokens, segments of {result.seg_len}, memory {result.mem_len}"
    seg_len, attention = result.seg_len, result.attention
    paths = {}
    for name in figures:
        if name == "fig5":
            figure = anatomy_viz.distance_figure(attention, seg_len, order, title)
        else:
            figure = anatomy_viz.terms_figure(result.terms, attention, seg_len, order, head, title)
        paths[name] = write(service, tab, name, ".png", anatomy_viz.figure_png(figure))
    return paths


def save_numbers(service, tab: AnatomyState) -> dict:
    numbers = anatomy_viz.anatomy_numbers(tab.result)
    write(service, tab, "json", ".json", json.dumps(numbers).encode())
    return numbers


def write(service, tab: AnatomyState, name: str, suffix: str, data: bytes) -> str:
    """A file in the service's export folder (older ones removed), remembered in the tab."""
    folder = Path(service.export_dir) / "anatomy"
    folder.mkdir(exist_ok=True)
    for old in folder.iterdir():
        if time.time() - old.stat().st_mtime > KEEP_FILES_S:
            old.unlink(missing_ok=True)
    path = folder / f"anatomy-{name}-{time.time_ns()}{suffix}"
    path.write_bytes(data)
    tab.files[name] = str(path)
    return str(path)
