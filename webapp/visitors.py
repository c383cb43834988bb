"""The visitors: what each browser session owns (a ``VisitorState``: its txl Session, text
and memory, and which model), all of them held weakly in ``Visitors``, and what frees them
when the visitor leaves or stays idle. ``user_errors`` holds one visitor's lock for a
request and turns a bad setting into the page's message.
"""

from __future__ import annotations

import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import gradio as gr

from txl.counterfactual import MemoryPair
from txl.model import TransformerXL
from txl.scoring import ScoreResult
from txl.session import Session

from .budget import trim_if_used, trim_memory


@dataclass(eq=False)  # compared and hashed by identity: Visitors holds them in a WeakSet
class VisitorState:
    """What one browser session owns: its Session (text + memory) and which model."""

    source: str
    session: Session
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    last_used: float = field(default_factory=time.monotonic, repr=False)
    expired: bool = False  # released by Visitors: its text and memory are gone
    restored_s: float | None = None  # this request read the memory back from disk: seconds
    # The last Score whose sliding window was done (its moments' Watch it reads the text)
    scored: ScoreResult | None = field(default=None, repr=False)
    # What Watch it left for the next Step: (prompt, tokens, token): while the session
    # still holds that prompt's tokens alone, the Step writes the text's own token.
    replay: tuple[str, int, int] | None = field(default=None, repr=False)
    # (position, token) of the last step that wrote a given token (the text's own: Watch
    # it's, an example's), not a sampled one; None once the text starts over.
    given: tuple[int, int] | None = field(default=None, repr=False)
    # The "Memory on | off" tab's two generations (a txl.counterfactual.MemoryPair), made
    # at its first Step, and the prompt and settings they run with
    pair: MemoryPair | None = field(default=None, repr=False)
    pair_key: tuple | None = field(default=None, repr=False)

    @property
    def sessions(self) -> list[Session]:
        """Every Session this visitor holds: the Watch tab's, and the pair's two."""
        return [self.session, *(self.pair.sessions if self.pair is not None else ())]

    @property
    def model(self) -> TransformerXL:
        return self.session.model


class Visitors:
    """Every VisitorState of the app, held weakly, and what frees them.

    Gradio drops a state ``time_to_live`` seconds after it was last stored (calling
    delete_callback), drops the states beyond ``state_session_capacity`` without calling
    it, and is written to keep a closed tab's state for an hour whatever the time_to_live
    (with Starlette 1.x it does not notice the close). So a sweep every second frees the
    text and memory of every session idle for ``ttl`` seconds itself, and hands the freed
    memory back to the OS whenever a session was released or dropped. ``on_release(session)``
    runs after a session was freed (the memory budget forgets it and removes its file).
    """

    def __init__(self, ttl: float, every: float = 1.0, on_release=None):
        self.ttl, self.every, self.on_release = ttl, every, on_release
        self._states: weakref.WeakSet[VisitorState] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._count = 0  # states alive at the last sweep: fewer now means some were dropped
        self._freed = False
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._states)

    def add(self, state: VisitorState) -> VisitorState:
        with self._lock:
            self._states.add(state)
            self._count += 1
            if self._thread is None:  # the first session starts the sweeps
                self._thread = threading.Thread(
                    target=_sweep_forever, args=(weakref.ref(self),), daemon=True
                )
                self._thread.start()
        return state

    def release(self, state: VisitorState | None, idle: float | None = None) -> bool:
        """Free a session's text and memory (Gradio's delete_callback; the sweep, which
        passes ``idle``: only if still idle that long). A session busy with a request is
        in use: it is left alone, and so is the event loop that calls delete_callback."""
        if state is None or state.expired or not state.lock.acquire(blocking=False):
            return False
        try:
            if idle is not None and time.monotonic() - state.last_used <= idle:
                return False
            state.expired = self._freed = True
            for session in state.sessions:
                session.reset()
                if self.on_release is not None:
                    self.on_release(session)
            return True
        finally:
            state.lock.release()

    def sweep(self) -> int:
        """Release the sessions idle for ttl seconds; trim the heap if anything went."""
        now = time.monotonic()
        with self._lock:
            states = list(self._states)
        released = sum(
            self.release(s, idle=self.ttl)
            for s in states
            if not s.expired and now - s.last_used > self.ttl
        )
        del states
        with self._lock:
            dropped, self._count = len(self._states) < self._count, len(self._states)
        if self._freed or dropped:
            self._freed = False
            trim_memory()
        else:  # what the requests of the last second freed goes back to the OS
            trim_if_used()
        return released


def _sweep_forever(ref: weakref.ref) -> None:
    """Sweep every ``every`` seconds for as long as the Visitors object lives."""
    while (visitors := ref()) is not None:
        every = visitors.every
        del visitors  # not kept alive by this thread while it sleeps
        time.sleep(every)
        if (visitors := ref()) is not None:
            visitors.sweep()


@contextmanager
def user_errors(state: VisitorState | None = None, timeout: float = 30.0):
    """Hold the session's lock; turn bad settings (ValueError) into a message in the UI."""
    if state is not None and not state.lock.acquire(timeout=timeout):
        raise gr.Error("Still busy with your previous request: try again in a moment.")
    try:
        yield
    except ValueError as e:
        raise gr.Error(str(e)) from None
    finally:
        if state is not None:
            state.last_used = time.monotonic()
            state.lock.release()
