"""Play on the Watch tab: one stream of steps, painted as they come. Its control (every
visitor's Play numbers), its handlers (/play, /play_stop) and its events live here; each
of its steps is the tab's Step (``WatchTab.take_step``, webapp/tabs/watch.py).

Pressing Play starts one server-side stream (a Gradio generator event) that steps the
session as fast as the model goes and sends the page the newest step's views:

    Play pressed -> WatchPlay.run(play_id, ...)             one event, many messages
        step, step, step, ...                               each under the visitor's lock
        every PLAY_EVERY_S: yield the page's views packed   (the text keeps every step)
    Pause pressed -> WatchPlay.stop(play_id)                a flag, no lock, no waiting

A round trip per step (the page asks, the server answers, the page paints, then asks
again) made Play no faster than one Step; a stream steps at the model's speed. The page
cannot paint every step (a paint costs more than a step), so the stream sends at most one
message every PLAY_EVERY_S seconds, with the newest step's views and the whole text: the
steps between are in the text and the step history, not painted one by one. While other
visitors' requests are in flight, the stream waits as long as its last step took between
steps, so that it takes at most half a core from them.

**Pause and the race.** A step computed but not yet sent when Pause lands must be shown
or not taken. The stream checks the stop flag *under the visitor's lock, before each
step*, and when it stops it first sends the views of the session as it is (if a step was
taken since its last message): every step it took reaches the page, and none is taken
after the flag is seen. The page marks Play stopped only when the stream's event has
ended (webapp/web/views.js), so the painted text is then the session's.

The page numbers its Plays (``play_id``, 1, 2, ...: views.js); Pause stops every Play up
to its own number. So a Pause that reaches the server before its Play has started (the
Play still queued) stops it all the same: the stream sees its number paused and takes no
step. A newer Play also stops an older one still running. Anything else that changes the
session (Step, Generate, Reset, Load) ends the stream too: it stops when the session is
not as its own last step left it.

Each step is a Step: the same code (``WatchTab.take_step``), the visitor's lock, the
memory budget and the pacing beside long jobs (``DemoService.using``: webapp/serve.py,
longwork.py), one step of growth at a time; so a Play of n steps leaves the text, memory
and predictions of n Steps with the same settings. The settings are the page's when Play
is pressed; changed during Play, they apply with their own event
(``WatchTab.settings_changed``), as the next Step would take them, and a layer or head
chosen is drawn from the next message on (``choose_view``, from the page's redraw).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import gradio as gr

from webapp.serve import Settings
from webapp.visitors import user_errors

from .watch_views import current_views

PLAY_EVERY_S = 0.1  # the stream sends the newest views at most this often (10 paints a second)


@dataclass
class _Plays:
    """One visitor's Plays: the newest started, the newest paused, the view to draw."""

    started: int = 0
    paused: int = 0
    view: tuple = (None, None)  # (layer, head) the page shows


class PlayControl:
    """Every visitor's Play numbers, by Gradio session (``request.session_hash``: a Pause
    can come before the first Play has made the visitor's state). The newest
    ``max_visitors`` are kept: a few dozen bytes each."""

    def __init__(self, max_visitors: int = 10_000):
        self._plays: OrderedDict[str, _Plays] = OrderedDict()
        self._lock = threading.Lock()
        self.max_visitors = max_visitors

    def _of(self, visitor: str) -> _Plays:
        with self._lock:
            plays = self._plays.pop(visitor, None) or _Plays()
            self._plays[visitor] = plays  # the newest last
            while len(self._plays) > self.max_visitors:
                self._plays.popitem(last=False)
            return plays

    def start(self, visitor: str, play_id: int, view: tuple) -> None:
        plays = self._of(visitor)
        plays.started, plays.view = max(plays.started, play_id), view

    def stop(self, visitor: str, play_id: int) -> None:
        """Stop the visitor's Plays numbered up to ``play_id``, running or still queued."""
        plays = self._of(visitor)
        plays.paused = max(plays.paused, play_id)

    def goes_on(self, visitor: str, play_id: int) -> bool:
        plays = self._of(visitor)
        return play_id > plays.paused and play_id == plays.started

    def choose_view(self, visitor: str, layer, head) -> None:
        """The layer and head the page shows now (the page's redraw): Play draws them."""
        self._of(visitor).view = (layer, head)

    def view(self, visitor: str) -> tuple:
        return self._of(visitor).view


def visitor_of(request) -> str:
    """The visitor's key: Gradio's session hash (one per page load or API client)."""
    return str(request.session_hash)


def as_play_id(value) -> int:
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


class WatchPlay:
    """Play's handlers on the Watch tab (``tab``: its ``take_step`` and its service), and
    ``control``, every visitor's Plays."""

    def __init__(self, tab):
        self.tab = tab
        self.service = tab.service
        self.control = PlayControl()  # every visitor's Play and Pause

    def run(
        self, play_id, prompt, memory, mem_len, temperature, top_k, top_p, seed, layer, head,
        state, request: gr.Request,
    ):  # fmt: skip
        """Play (/play): step the session until stopped; yield the page's outputs (the
        WatchViews, packed) of the newest step at most every PLAY_EVERY_S, and of the last
        step taken when it stops. The settings are /step's, as the page sent them."""
        settings = Settings.of(locals())
        service, control, visitor = self.service, self.control, visitor_of(request)
        play_id = as_play_id(play_id)
        state = service.ensure(state)
        control.start(visitor, play_id, (layer, head))

        def page_views():  # the page's outputs of the session now, packed
            return current_views(state, *control.view(visitor)).packed()

        own = None  # (session, tokens) after this stream's last step; None before its first
        unsent = False  # a step was taken since the last message
        last, error, sent_at = None, None, -PLAY_EVERY_S  # the first step is sent at once
        while unsent or control.goes_on(visitor, play_id):  # stopped and all sent: no lock
            views, took = None, 0.0
            with service.using(state, settings.mem_len, steps=1):
                s = state.session
                if state.expired or (own is not None and own != (s, len(s.ids))):
                    unsent = False  # a Step, Generate, Reset or Load changed it: theirs to show
                    break
                if not control.goes_on(visitor, play_id):  # paused, under the lock: no more
                    last = page_views() if unsent else None
                    break
                started = time.perf_counter()
                try:
                    first = own is None
                    self.tab.take_step(state, prompt, settings, *control.view(visitor), first)
                except Exception as e:  # the text is full (say): the steps before it, then why
                    last, error = page_views(), e
                    break
                own, unsent, took = (s, len(s.ids)), True, time.perf_counter() - started
                if time.perf_counter() - sent_at >= PLAY_EVERY_S:
                    views, unsent, sent_at = page_views(), False, 0.0
            if views is not None:
                yield views  # (not under the lock) Gradio stops here when the visitor has left
                sent_at = time.perf_counter()
            if service.traffic.busy:  # others' requests in flight: leave them the core as long
                time.sleep(took)
        if unsent and last is not None:
            yield last
        if error is not None:
            with user_errors():  # a ValueError as the page's error message, as for Step
                raise error

    def stop(self, play_id, request: gr.Request) -> None:
        """Pause (/play_stop; and Step, Generate, Reset, Load while Play runs): the
        visitor's Plays up to ``play_id`` stop before their next step. No lock: it never
        waits."""
        self.control.stop(visitor_of(request), as_play_id(play_id))

    def choose_view(self, layer, head, request: gr.Request) -> None:
        """The page's redraw chose a layer and head: a running Play draws them."""
        self.control.choose_view(visitor_of(request), layer, head)

    # -- the page --

    @staticmethod
    def build() -> dict:
        """Triggers the page never shows: Play's stream and its stop, which
        webapp/web/views.js clicks with its Play number."""
        return dict(
            play_run=gr.Button("Play", visible="hidden", elem_id="play_run"),
            play_stop=gr.Button("Pause", visible="hidden", elem_id="play_stop"),
            play_id=gr.Number(0, precision=0, visible=False, elem_id="play_id"),
        )

    def wire(self, ui: dict, step_inputs: list, views: list) -> None:
        """Play's events: the Play button toggles Play in the page (views.js), which starts
        and stops the stream with its Play number; several may be in flight (a Pause, then
        Play again at once). /play and /play_stop are undocumented API endpoints (a client
        passes play_id)."""
        ui["play"].click(None, js="() => { TXL.togglePlay(); }")
        page_api = dict(api_visibility="undocumented", show_progress="hidden")
        with_id = dict(js="(...inputs) => TXL.withPlayId(...inputs)", trigger_mode="multiple")
        ui["play_run"].click(
            self.run,
            [ui["play_id"], *step_inputs],
            views,
            api_name="play",
            concurrency_id="play",
            **with_id,
            **page_api,
        ).then(None, js="() => { TXL.playEnded(); }")
        ui["play_stop"].click(
            self.stop,
            [ui["play_id"]],
            None,
            api_name="play_stop",
            concurrency_limit=None,
            **with_id,
            **page_api,
        )
