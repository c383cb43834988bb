"""What the Watch tab shows of a visitor's session after each event: the eight outputs
(``WatchViews``), composed from webapp/watch_viz.py's views of the session's traces, the
newest step's or one from the step history, for the layer and head the dropdowns chose
(``layer_choices``, ``head_choices``: what they offer; ``view_choice``: what they chose),
and the empty frames the page draws them into (the templates). Plain data, no components:
webapp/tabs/watch.py's handlers return these and lay the frames out.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from txl import TXLConfig
from txl.model import TransformerXL
from txl.session import Session, memory_bytes_per_position
from webapp import anatomy_viz, figures, watch_viz
from webapp.inputs import parse_choice
from webapp.visitors import VisitorState

HEATMAP_COLUMNS = 160  # more keys than this are summed into buckets (mem_len 128 + 1 fits)
ALL_LAYERS, MEAN_HEADS = "all layers", "mean over heads"
EMPTY_HEATMAP = "Step or Generate to see where the newest token looks."
# The per-step views (parts.page_view): gr.HTML whose value is a dict (webapp.watch_viz's
# text_view, attention_view, ...) drawn by webapp/web/*.js. The templates do not depend on
# the value, so Gradio leaves their DOM alone and only the watch() callbacks redraw.
ATTENTION_TEMPLATE = (
    f'<div class="txl-att"><div class="txl-empty">{EMPTY_HEATMAP}</div><canvas></canvas>'
    '<div class="txl-att-bar"><button class="txl-png" type="button" '
    'title="Save this view as PNG">⤓ PNG</button></div>'
    '<div class="txl-tip"></div></div><div class="txl-terms"></div>'
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


class WatchViews(NamedTuple):
    """What an event that redraws the tab returns, in the order of ``outputs`` (the API's
    outputs of /generate, /step, /reset): a new output goes before ``state``."""

    text: str
    text_view: dict | None
    status: str
    attention: dict | None
    history: int  # the slider: 0, the newest step
    summary: dict | None
    predictions: dict | None
    state: VisitorState

    def packed(self) -> WatchViews:
        """The page's own events (Step, Generate, Continue, Play): the four views' dicts
        as one JSON string each (figures.packed), which the page copies far faster."""
        return self._replace(
            text_view=figures.packed(self.text_view),
            attention=figures.packed(self.attention),
            summary=figures.packed(self.summary),
            predictions=figures.packed(self.predictions),
        )


def outputs(ui: dict, state) -> list:
    """The components of WatchViews, in its order: every event that redraws the tab (and
    the other tabs' Watch it) has these outputs."""
    views = [ui[k] for k in ("text_out", "text_html", "status", "attention", "history")]
    return [*views, ui["summary"], ui["predictions"], state]


def text_views(s: Session, layer=None, head=None) -> tuple[str, dict, str]:
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
    if fresh:
        roles = watch_viz.roles_from_trace(n, t, window)
    else:
        roles = watch_viz.roles_from_info(n, info, window)
    layer, head = view_choice(s, layer, head)
    unit = s.tokenizer.unit
    shaded = t if fresh and t.attentions is not None else None
    effect = s.memory_effect
    view = watch_viz.text_view(
        s.pieces, roles, shaded, layer, head, info["memory"], unit=unit, effect=effect,
        window=window,
    )  # fmt: skip
    latency = t.latency_ms if fresh else None
    share = watch_viz.beyond_window_share(shaded, window, layer, head)
    beyond = None if share is None else (share, window, watch_viz.choice_words(layer, head))
    status = watch_viz.status_markdown(
        info, n, latency, unit=unit, saved=effect.bits_saved(), beyond=beyond
    )
    return s.text, view, status


def attention_views(state: VisitorState, layer, head):
    """(attention view's data, step summary) of the last step."""
    s, t = state.session, state.session.last_trace
    if t is None or t.attentions is None:
        return None, None
    layer, head = view_choice(s, layer, head)
    # One layer and one head chosen: its four score terms, as strips and in the summary.
    terms = anatomy_viz.step_terms(t, layer, head, s.model.layers[0].attn.scale)
    unit = s.tokenizer.unit
    view = watch_viz.attention_view(
        t, s.pieces, layer, head, HEATMAP_COLUMNS, unit, terms=terms, window=s.seg_len
    )
    return view, watch_viz.step_summary(t, s.memory_info(), far=s.seg_len, terms=terms)


def predictions_view(state: VisitorState, t=None, history=None) -> dict | None:
    """The bars' data (webapp/web/predictions.js): step ``t``'s prediction with and
    without memory (the last step when None), and whether its token was given (the
    text's own, ``VisitorState.given``) rather than sampled."""
    s = state.session
    t = s.last_trace if t is None else t
    given = t is not None and state.given == (t.position, t.token_id)
    return watch_viz.predictions_view(t, s.seg_len, s.tokenizer.unit, history, given)


def current_views(state: VisitorState, layer, head, started: float | None = None) -> WatchViews:
    """Every output of the tab, of the session now (the history slider back at 0)."""
    text, text_view, status = text_views(state.session, layer, head)
    attention, summary = attention_views(state, layer, head)
    predictions = predictions_view(state)
    if summary is not None and started is not None:
        summary["handler_ms"] = round((time.perf_counter() - started) * 1e3, 2)
    status += restore_note(state)
    return WatchViews(text, text_view, status, attention, 0, summary, predictions, state)


def past_views(state: VisitorState, back: int, layer, head) -> tuple[dict, dict | None]:
    """(text view, attention view) of the step ``back`` steps ago, the text as it was."""
    s = state.session
    t = s.past_trace(back)
    if t is None or (back == 0 and s.last_trace is not None):
        _, text_view, _ = text_views(s, layer, head)
        return text_view, attention_views(state, layer, head)[0]
    layer, head = view_choice(s, layer, head)
    pieces, n = s.pieces[: t.position + 1], t.position + 1
    window, unit = s.seg_len, s.tokenizer.unit
    roles = watch_viz.roles_from_trace(n, t, window)
    text_view = watch_viz.text_view(
        pieces, roles, t, layer, head, t.memory, unit=unit, effect=s.memory_effect,
        window=window,
    )  # fmt: skip
    steps_back = min(back, len(s.history) - 1)  # past_trace clamps the same way
    history = (steps_back, len(s.history))
    attention = watch_viz.attention_view(
        t, pieces, layer, head, HEATMAP_COLUMNS, unit, history=history, window=window
    )
    return text_view, attention


def past_step(state: VisitorState, back: int) -> tuple[dict | None, dict | None]:
    """(step summary, predictions view) of the step ``back`` steps ago."""
    s = state.session
    t = s.last_trace if back == 0 and s.last_trace is not None else s.past_trace(back)
    if t is None:
        return None, None
    history = None if t is s.last_trace else (min(back, len(s.history) - 1), len(s.history))
    summary = watch_viz.step_summary(t, far=s.seg_len)
    return summary, predictions_view(state, t, history)


def view_choice(s: Session, layer, head) -> tuple[int | None, int | None]:
    """The layer and head the dropdowns chose (None: all layers, the mean over heads)."""
    c = s.model.config
    return parse_choice(layer, "layer", c.n_layer), parse_choice(head, "head", c.n_head)


def layer_choices(config: TXLConfig) -> dict:
    return dict(
        choices=[ALL_LAYERS] + [f"layer {i}" for i in range(config.n_layer)], value=ALL_LAYERS
    )


def head_choices(config: TXLConfig) -> dict:
    return dict(
        choices=[MEAN_HEADS] + [f"head {i}" for i in range(config.n_head)], value=MEAN_HEADS
    )


def restore_note(state: VisitorState) -> str:
    """For the status line: the memory came back from disk in this request."""
    if state.restored_s is None:
        return ""
    return (
        f" · memory restored from disk in {state.restored_s * 1e3:,.0f} ms "
        "(idle sessions' memories wait there while the server is busy)"
    )


def model_markdown(source: str, model: TransformerXL, mem_cap: int) -> str:
    """The model line: its source, shape, size, and the per-session memory cap if any."""
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    unit = model.tokenizer.unit + "s" if model.tokenizer else "tokens"
    cap = ""
    if mem_cap < c.mem_len:
        cap = (
            f" · **memory capped at {mem_cap:,} positions per session** "
            f"({figures.format_bytes(mem_cap * memory_bytes_per_position(model))}, "
            "TXL_SESSION_MEMORY_MB)"
        )
    return (
        f"**Model** `{source}` · {c.n_layer} layers × {c.n_head} heads · d_model {c.d_model} · "
        f"{c.vocab_size:,} {unit} · {n_params / 1e6:.2f}M parameters ({dtype}) · "
        f"segments of {c.tgt_len} · a memory of {c.mem_len} by default{cap}"
    )
