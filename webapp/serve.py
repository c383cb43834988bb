"""The server's machinery, without the page: models loaded once and shared, each browser
session's state and its expiry, and the checks every input passes before it reaches a
Session. ``app.py`` lays out the page and wires events to thin handlers built on
``Server``; everything here can be tested without a browser.

Environment: TXL_MODEL (model to load first), TXL_MAX_SESSIONS, TXL_SESSION_TTL,
TXL_MAX_PARAMS, TXL_DTYPE, TXL_SESSION_MEMORY_MB, TXL_MODEL_DIRS, TXL_MEMORY_BUDGET_MB,
TXL_OFFLOAD_DISK_MB: see app.py's docstring (and webapp/budget.py for the last two).
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
import weakref
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr
import torch

from txl.config import TXLConfig
from txl.hub import CONFIG_NAME, TXLLoadError
from txl.loading import load_config
from txl.model import TransformerXL
from txl.recall import DISTANCES, check_recall, probe_text, recall_probe
from txl.session import (
    ScoreResult,
    Session,
    check_seed,
    check_temperature,
    check_top_p,
    memory_bytes_per_position,
)

from . import viz
from .budget import (
    MemoryBudget,
    default_budget_bytes,
    growth_bytes,
    memory_cap,
    note_heap_use,
    trim_if_used,
    trim_memory,  # the sweep's; it lives with the allocator settings now
    tune_allocator,
)
from .longwork import JobCancelled, Traffic
from .recall_viz import recall_figure, recall_markdown, recall_numbers

ROOT = Path(__file__).resolve().parents[1]  # the repository: app.py and weights/ live here
BUNDLED_MODEL = "weights/shakespeare-char"
MAX_MEM_LEN = 2048
MAX_PROMPT_CHARS = 20_000
MAX_TEXT_CHARS = 100_000  # a session's text: Continue and Step stop here (Reset starts over)
HISTORY_STEPS = 256  # steps whose attention a session keeps for the history slider
MAX_SCORE_CHARS = 20_000
MAX_SLIDING_CHARS = 5_000  # the score's sliding window runs the model once per character
SCORE_STREAM_EVERY_S = 0.25  # the sliding window's progress is sent at most this often
MODEL_CACHE_SIZE = 3  # models kept loaded besides those that live sessions still use


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


# ---- models: loaded once per source, shared read-only by every session ---------------


def resolve_source(source: str | None) -> str:
    """A folder as an absolute path (a relative one is looked up in the working directory,
    then next to app.py), anything else (a Hub repo id) as typed; empty: the bundled model."""
    source = (source or "").strip() or BUNDLED_MODEL
    if source.rstrip("/") == BUNDLED_MODEL:  # never looked up on the Hub, even when missing
        return str(ROOT / BUNDLED_MODEL)
    try:  # a name too long for the file system (ENAMETOOLONG) is no folder
        local = Path(source).expanduser()
        if local.is_dir():
            return str(local.resolve())
        if not source.startswith((".", "/", "~")) and (ROOT / source).is_dir():
            return str((ROOT / source).resolve())
    except (OSError, RuntimeError, ValueError):  # also ~nosuchuser, NUL in a path
        pass
    return source


def allowed_folder(source: str, folders: list[Path]) -> bool:
    """Whether a resolved source is a Hub id, or a folder inside one of ``folders``."""
    path = Path(source)
    if not path.is_absolute():
        return True  # not a folder here: fetch_file decides whether it is a valid repo id
    return any(path == d or d in path.parents for d in folders)


def check_config(source: str, max_params: int) -> TXLConfig:
    """Read config.json first: refuse oversized models before the weights are downloaded."""
    config = load_config(source)
    params = config.n_params()
    if params > max_params:
        raise TXLLoadError(
            f"{source}: {params / 1e6:.0f}M parameters, more than this app's limit of "
            f"{max_params / 1e6:.0f}M (TXL_MAX_PARAMS)"
        )
    return config


def pick_dtype(setting: str, n_params: int) -> torch.dtype:
    """TXL_DTYPE: float32, bfloat16, or auto (bfloat16 above 100M parameters: half the
    memory for the weights and for every session's memory)."""
    setting = (setting or "auto").strip().lower()
    if setting not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"TXL_DTYPE must be auto, float32 or bfloat16, got {setting!r}")
    if setting == "auto":
        return torch.bfloat16 if n_params > 100_000_000 else torch.float32
    return getattr(torch, setting)


class ModelCache:
    """Loaded models by source; the least recently used beyond ``size`` are dropped (the
    sessions that use them keep them alive)."""

    def __init__(self, size: int = MODEL_CACHE_SIZE, max_params: int = 400_000_000):
        self.size, self.max_params = size, max_params
        self.dtype_setting = os.environ.get("TXL_DTYPE", "auto")
        self._models: OrderedDict[str, TransformerXL] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, source: str, progress=None) -> TransformerXL:
        source = resolve_source(source)
        with self._lock:
            if source in self._models:
                self._models.move_to_end(source)
                return self._models[source]
        if progress is not None:
            progress(0.1, desc=f"reading {CONFIG_NAME}")
        config = check_config(source, self.max_params)
        if progress is not None:
            progress(0.4, desc="loading the weights")
        dtype = pick_dtype(self.dtype_setting, config.n_params())
        model = TransformerXL.from_pretrained(source, dtype=dtype)
        if model.tokenizer is None:
            raise TXLLoadError(f"{source}: the model came without a vocabulary to write with")
        with self._lock:
            self._models[source] = model
            while len(self._models) > self.size:
                self._models.popitem(last=False)
        return model


def warm_up(model: TransformerXL) -> None:
    """A Step of a throwaway session, before the first visitor: a segment fed over the
    memory, then one step with its counterfactual and score terms. The first model call of
    each kind pages in torch's kernels (28 MB of libtorch's code for the bundled model)
    and sets up caches for good (another 13 MB, measured with /proc/self/smaps); done
    here, that is part of the server's start rather than the first visitor's Step (30-60
    ms more) and the growth of RSS that the sessions' memory budget is held to. Takes
    ~0.2 s for the bundled model."""
    s = Session(model)
    # seg_len + 1 start tokens as text (unknown symbols are replaced or dropped: any
    # text will do): the prompt fills a whole segment
    s.start(model.tokenizer.decode([s.start_id] * (s.seg_len + 1)))
    s.step()
    del s
    trim_memory()


def model_markdown(source: str, model: TransformerXL, mem_cap: int) -> str:
    c = model.config
    n_params = sum(p.numel() for p in model.parameters())
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    unit = model.tokenizer.unit + "s" if model.tokenizer else "tokens"
    cap = ""
    if mem_cap < c.mem_len:
        cap = (
            f" · **memory capped at {mem_cap:,} positions per session** "
            f"({viz.format_bytes(mem_cap * memory_bytes_per_position(model))}, "
            "TXL_SESSION_MEMORY_MB)"
        )
    return (
        f"**Model** `{source}` · {c.n_layer} layers × {c.n_head} heads · d_model {c.d_model} · "
        f"{c.vocab_size:,} {unit} · {n_params / 1e6:.2f}M parameters ({dtype}) · trained "
        f"with segments of {c.tgt_len} and a memory of {c.mem_len}{cap}"
    )


# ---- one browser session's state -----------------------------------------------------


@dataclass(eq=False)  # compared and hashed by identity: Sessions holds them in a WeakSet
class UserState:
    """What one browser session owns: its Session (text + memory) and which model."""

    source: str
    session: Session
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    last_used: float = field(default_factory=time.monotonic, repr=False)
    expired: bool = False  # released by Sessions: its text and memory are gone
    restored_s: float | None = None  # this request read the memory back from disk: seconds
    # The last Score whose sliding window was done (its moments' Watch it reads the text)
    scored: ScoreResult | None = field(default=None, repr=False)
    # What Watch it left for the next Step: (prompt, tokens, token): while the session
    # still holds that prompt's tokens alone, the Step writes the text's own token.
    replay: tuple[str, int, int] | None = field(default=None, repr=False)

    @property
    def model(self) -> TransformerXL:
        return self.session.model


class Sessions:
    """Every UserState of the app, held weakly, and what frees them.

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
        self._states: weakref.WeakSet[UserState] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._count = 0  # states alive at the last sweep: fewer now means some were dropped
        self._freed = False
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._states)

    def add(self, state: UserState) -> UserState:
        with self._lock:
            self._states.add(state)
            self._count += 1
            if self._thread is None:  # the first session starts the sweeps
                self._thread = threading.Thread(
                    target=_sweep_forever, args=(weakref.ref(self),), daemon=True
                )
                self._thread.start()
        return state

    def release(self, state: UserState | None, idle: float | None = None) -> bool:
        """Free a session's text and memory (Gradio's delete_callback; the sweep, which
        passes ``idle``: only if still idle that long). A session busy with a request is
        in use: it is left alone, and so is the event loop that calls delete_callback."""
        if state is None or state.expired or not state.lock.acquire(blocking=False):
            return False
        try:
            if idle is not None and time.monotonic() - state.last_used <= idle:
                return False
            state.session.reset()
            state.expired = self._freed = True
            if self.on_release is not None:
                self.on_release(state.session)
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
    """Sweep every ``every`` seconds for as long as the Sessions object lives."""
    while (sessions := ref()) is not None:
        every = sessions.every
        del sessions  # not kept alive by this thread while it sleeps
        time.sleep(every)
        if (sessions := ref()) is not None:
            sessions.sweep()


@contextmanager
def user_errors(state: UserState | None = None, timeout: float = 30.0):
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


def as_int(name: str, value, lo: int, hi: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not number.is_integer():
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= number <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {int(number)}")
    return int(number)


def parse_choice(value, prefix: str, limit: int) -> int | None:
    """'layer 3' / '3' -> 3; 'all layers' / 'mean over heads' / None / out of range -> None."""
    match = re.fullmatch(rf"\s*(?:{prefix}\s*)?(\d+)\s*", str(value or ""))
    if match is None:
        return None
    index = int(match.group(1))
    return index if index < limit else None


def name_input_errors(components) -> None:
    """Gradio checks a Slider's or a Number's range before the handler runs, with a message
    that does not say which setting ("Value 5 is greater than maximum value 2."), and a
    string, a null or a NaN sent through the API fails there with no message at all. Wrap
    the preprocessing of these inputs ((API name, component) pairs) so that every refusal
    says which parameter and why; a Checkbox takes true or false only."""
    for name, component in components:
        if isinstance(component, (gr.Slider, gr.Number)):
            integer = getattr(component, "precision", None) == 0  # gradio would round it
            component.preprocess = _named_number(name, component.preprocess, integer)
        elif isinstance(component, gr.Checkbox):
            component.preprocess = _strict_bool(name, component.preprocess)


def _named_number(name: str, preprocess, integer: bool = False):
    def checked(payload):
        if isinstance(payload, bool) or not isinstance(payload, (int, float)):
            raise gr.Error(f"{name} must be a number, got {payload!r:.60}")
        if integer and isinstance(payload, float) and not payload.is_integer():  # 2.5, NaN
            raise gr.Error(f"{name} must be an integer, got {payload}")
        try:
            return preprocess(payload)
        except gr.Error as e:
            raise gr.Error(f"{name}: {e.message}") from None
        except (ValueError, OverflowError):  # NaN or infinity rounded to an integer
            raise gr.Error(f"{name} must be a finite number, got {payload}") from None

    return checked


def _strict_bool(name: str, preprocess):
    def checked(payload):
        if not isinstance(payload, bool):
            raise gr.Error(f"{name} must be true or false, got {payload!r:.60}")
        return preprocess(payload)

    return checked


# ---- streaming: Gradio's diffs of nested lists ----------------------------------------


def streaming_diff(old, new) -> list:
    """The edits that turn ``old`` into ``new``, as ``gradio.utils.diff`` makes them for a
    generator's outputs (the client applies them in order), with its bug fixed: a list
    renumbers its deletes (each shifts the ones after it) but Gradio 6.31 renumbered the
    deletes of the lists *inside* it too, already renumbered at their own level. So a
    streamed value whose nested lists lose two or more items (the text view's runs while
    Generate streams) reached the client as deletes of wrong indices: an IndexError in
    gradio_client, a garbled view in the page."""

    def compare(a, b, path: list) -> list:
        if a == b:
            return []
        if type(a) is not type(b):
            return [["replace", path, b]]
        if isinstance(a, str) and b.startswith(a):
            return [["append", path, b[len(a) :]]]
        if isinstance(a, list):
            common = min(len(a), len(b))
            edits = [e for i in range(common) for e in compare(a[i], b[i], path + [i])]
            # Deleting item i shifts the next ones down: the k-th delete is of index common.
            edits += [["delete", path + [common], None] for _ in range(common, len(a))]
            edits += [["add", path + [i], b[i]] for i in range(common, len(b))]
            return edits
        if isinstance(a, dict):
            edits = [e for k in a if k in b for e in compare(a[k], b[k], path + [k])]
            edits += [["delete", path + [k], None] for k in a if k not in b]
            edits += [["add", path + [k], b[k]] for k in b if k not in a]
            return edits
        return [["replace", path, b]]

    return compare(old, new, [])


def fix_streaming_diff() -> None:
    """Make Gradio's streaming use streaming_diff (blocks.py calls ``utils.diff``)."""
    import gradio.utils

    gradio.utils.diff = streaming_diff


# ---- the server: models, sessions, settings ----------------------------------------


class Server:
    """The default model, the model cache and the session registry, and what every handler
    does before and after calling a Session: find or create the caller's state, check and
    apply the settings, start from the prompt. ``app.TXLApp`` adds the page and handlers."""

    def __init__(
        self,
        default_source: str | None = None,
        cache: ModelCache | None = None,
        model_dirs: list[str] | None = None,
        budget: MemoryBudget | None = None,
    ):
        tune_allocator()  # before the server's threads start: see webapp/budget.py
        fix_streaming_diff()  # Generate streams views with nested lists: see streaming_diff
        self.default_source = resolve_source(default_source or os.environ.get("TXL_MODEL"))
        self.cache = cache or ModelCache(max_params=env_int("TXL_MAX_PARAMS", 400_000_000))
        # Folders the Load box may read models from: the app's own, the default model's,
        # and TXL_MODEL_DIRS (os.pathsep-separated). Anything else must be a Hub repo id.
        if model_dirs is None:
            model_dirs = [d for d in os.environ.get("TXL_MODEL_DIRS", "").split(os.pathsep) if d]
        self.model_dirs = [Path(d).expanduser().resolve() for d in [str(ROOT), *model_dirs]]
        if Path(self.default_source).is_absolute():
            self.model_dirs.append(Path(self.default_source))
        self.export_dir = Path(tempfile.mkdtemp(prefix="txl-export-"))
        # Every session's memory together, within TXL_MEMORY_BUDGET_MB (idle ones to disk).
        self.budget = budget or MemoryBudget(default_budget_bytes())
        self.sessions = Sessions(env_int("TXL_SESSION_TTL", 3600), on_release=self.budget.release)
        # Short requests in flight and the long jobs (Score) beside them: webapp/longwork.py.
        self.traffic = Traffic()
        self.load_notice = None  # why the app serves the bundled model instead of TXL_MODEL
        try:  # load it now, so that the first visitor does not wait
            self.default_model = self.cache.get(self.default_source)
            self.load_error = None
        except TXLLoadError as e:
            self.default_model, self.load_error = None, str(e)
            if self.default_source == str(ROOT / BUNDLED_MODEL):
                self.load_error = (
                    f"the bundled model {BUNDLED_MODEL} is missing or incomplete ({e}); train "
                    "it, or set TXL_MODEL to another folder or a Hub repo id"
                )
            else:  # serve the bundled model rather than nothing, and say why
                try:
                    self.default_model = self.cache.get(BUNDLED_MODEL)
                except TXLLoadError:
                    pass
                else:
                    self.default_source = str(ROOT / BUNDLED_MODEL)
                    self.load_notice = f"{e}: serving the bundled model instead"
                    self.load_error = None
        if self.default_model is not None:
            warm_up(self.default_model)

    # -- state and settings --

    @staticmethod
    def session_budget() -> float:
        """Bytes one session's memory may take (TXL_SESSION_MEMORY_MB): its keys and values
        and its step history."""
        return float(os.environ.get("TXL_SESSION_MEMORY_MB") or 256) * 2**20

    def mem_cap(self, model: TransformerXL) -> int:
        """The largest mem_len a session of this model may use (MAX_MEM_LEN, or less when
        TXL_SESSION_MEMORY_MB would be exceeded: 18 layers x 1600 positions is 236 MB)."""
        return max(1, min(MAX_MEM_LEN, memory_cap(model, self.session_budget())))

    def fit_history(self, s: Session) -> None:
        """The step history keeps what the session's budget leaves beside its memory (at
        mem_len, with the buffers' spare room): all 256 steps of the bundled model at any
        mem_len, a few dozen of the WikiText-103 model's at its full memory."""
        kv = 1.25 * s.mem_len * memory_bytes_per_position(s.model)
        s.set_history_limit(max(0, int(self.session_budget() - kv)))  # trims it now

    def start_mem_len(self, model: TransformerXL) -> int:
        """A new session's mem_len: the model's own, within the per-session cap."""
        return min(model.config.mem_len, self.mem_cap(model))

    def new_state(self, source: str, model: TransformerXL) -> UserState:
        session = Session(model, mem_len=self.start_mem_len(model), history=HISTORY_STEPS)
        self.fit_history(session)
        return UserState(source=source, session=session)

    def ensure(self, state: UserState | None) -> UserState:
        """The caller's state, created on first use with the default model (and again
        when Sessions freed it after TXL_SESSION_TTL idle seconds)."""
        if state is not None and state.expired:
            gr.Warning(
                f"This session was idle for more than {self.sessions.ttl:g} s and its text "
                "was cleared: starting again."
            )
            state = None
        if state is not None:
            state.last_used = time.monotonic()
            return state
        if self.default_model is None:
            raise gr.Error(f"No model is loaded ({self.load_error}). Load one above.")
        return self.sessions.add(self.new_state(self.default_source, self.default_model))

    @contextmanager
    def using(self, state: UserState, mem_len=None, steps=0, grows: bool = True):
        """A request on the caller's session: hold its lock (user_errors), then room in
        the server's memory budget for what it may hold with ``mem_len`` (as sent; the
        session's when None or invalid) after ``steps`` steps, its memory read back
        first if it was on disk (``state.restored_s`` says how long that took).
        ``grows=False``: the request adds no memory (a redraw, a reset). It counts as a
        short request: long jobs (Score) slow down while it runs (webapp/longwork.py)."""
        with self.traffic.short(), user_errors(state):
            s = state.session
            try:
                mem_len = min(as_int("mem_len", mem_len, 0, MAX_MEM_LEN), self.mem_cap(s.model))
            except ValueError:  # apply_settings refuses it with its message
                mem_len = s.mem_len
            try:  # as sent: the handler checks it; the history keeps at most history_steps
                steps = min(max(0, int(float(steps))), s.history_steps)
            except (TypeError, ValueError, OverflowError):
                steps = s.history_steps
            growth = growth_bytes(s, mem_len, steps) if grows else 0
            try:
                with self.budget.use(s, state.lock, growth) as restored_s:
                    state.restored_s = restored_s
                    yield
            finally:
                note_heap_use()  # the sweep trims the heap within a second

    # -- the score: long work, streamed --

    def score_check(self, text, state: UserState | None) -> None:
        """Refuse a text the score cannot use, with a message that says why (the page runs
        this first, so that a refused text leaves the charts as they were)."""
        text = text or ""
        if len(text) > MAX_SCORE_CHARS:
            raise gr.Error(
                f"The text is {len(text):,} characters; the limit is {MAX_SCORE_CHARS:,}."
            )
        model = state.model if state is not None and not state.expired else self.default_model
        if model is None:
            raise gr.Error(f"No model is loaded ({self.load_error}). Load one above.")
        unknown = "replace" if model.tokenizer.unk_symbol is not None else "ignore"  # as Session
        if len(model.tokenizer.encode(text, errors=unknown)) < 2:
            raise gr.Error("Nothing to score: paste at least two characters the model knows.")

    def score_click(self, text, state: UserState | None) -> None:
        """The page's Score button, before ``score``: check the text, then stop this
        session's running Score at once (not when the new one gets its turn in the queue)."""
        self.score_check(text, state)
        if state is not None:
            self.traffic.cancel(state)

    def score(self, text, mem_len, state):
        """The text read three ways (segments alone, a sliding window of the segment
        length, memory) and with memories of 0 to 1,024, in stages as they are ready:
        memory and segments alone (curves, bpc, times, words) first, then the
        memory-length sweep, then the sliding window's progress and, at the end, all five
        outputs complete. A generator: Gradio streams each stage, gradio_client's
        ``predict`` returns the last. The work runs as a long job (webapp/longwork.py): two
        threads when the cores are free and two pay, paused for other visitors' Steps,
        cancelled by this session's next Score or when the visitor leaves."""
        state = self.ensure(state)
        self.score_check(text, state)
        text = text or ""
        with user_errors():
            mem_len = min(as_int("mem_len", mem_len, 0, MAX_MEM_LEN), self.mem_cap(state.model))
            scorer = Session(state.model, mem_len=mem_len)  # the user's text stays untouched
        sliding = len(text) <= MAX_SLIDING_CHARS
        unit, seg_len = scorer.tokenizer.unit, scorer.seg_len
        job = self.traffic.start_job(owner=state)
        sent = 0.0
        try:
            for stage in scorer.score_stages(text, sliding=sliding, pace=job.turn):
                result, sweep = stage.result, stage.sweep
                summary = viz.score_markdown(result, seg_len, mem_len, unit=unit)
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
                        viz.surprisal_figure_from_result(result),
                        summary,
                        viz.score_numbers(result, sweep, moments),
                        viz.context_figure(sweep, unit=unit, sliding_bpc=result.bpc_sliding),
                        viz.context_markdown(sweep, unit=unit),
                        state,
                    )
                    return
                if sliding:
                    summary += "\n\n" + viz.sliding_progress_markdown(
                        stage.done, stage.total, stage.seconds_left, seg_len, unit
                    )
                skip = gr.skip()
                if stage.kind == "reads":
                    sent = time.monotonic()
                    yield (
                        viz.surprisal_figure_from_result(result),
                        summary,
                        viz.score_numbers(result),
                        skip,
                        viz.SWEEP_PENDING,
                        state,
                    )
                elif stage.kind == "sweep":
                    sent = time.monotonic()
                    yield (
                        skip,
                        summary,
                        viz.score_numbers(result, sweep),
                        viz.context_figure(sweep, unit=unit),
                        viz.context_markdown(sweep, unit=unit),
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

    def recall_check(self, name, filler, mem_len, state: UserState | None):
        """(model, name, filler, mem_len) of a probe that can run, or a message that says
        why not (the page runs this first, so that a refused probe leaves the chart as it
        was). The name is taken without the spaces around it."""
        model = state.model if state is not None and not state.expired else self.default_model
        if model is None:
            raise gr.Error(f"No model is loaded ({self.load_error}). Load one above.")
        name, filler = str(name or "").strip(), str(filler or "")
        if len(filler) > MAX_SCORE_CHARS:
            raise gr.Error(
                f"The filler is {len(filler):,} characters; the limit is {MAX_SCORE_CHARS:,} "
                f"(the probe uses its first {max(DISTANCES):,})."
            )
        with user_errors():
            mem_len = as_int("mem_len", mem_len, 0, self.mem_cap(model))
            check_recall(model, name, filler, DISTANCES, mem_len)
        return model, name, filler, mem_len

    def recall_click(self, name, filler, mem_len, state: UserState | None) -> None:
        """The page's Probe button, before ``recall``: check the inputs, then stop this
        session's running probe at once."""
        self.recall_check(name, filler, mem_len, state)
        if state is not None:
            self.traffic.cancel(recall_owner(state))

    def recall(self, name, filler, mem_len, state):
        """How far back can it recall? (txl/recall.py): the name planted k characters
        back for every k of DISTANCES, read with memory, through the window and in
        segments alone; (chart, sentence, numbers) after every row, as it is ready. A
        long job (webapp/longwork.py), paced segment by segment beside other visitors'
        Steps, cancelled by this session's next probe (not by its Score) or when the
        visitor leaves."""
        state = self.ensure(state)
        model, name, filler, mem_len = self.recall_check(name, filler, mem_len, state)
        window = model.config.tgt_len
        job = self.traffic.start_job(owner=recall_owner(state))
        rows, started = [], time.perf_counter()
        try:
            for row in recall_probe(model, name, filler, DISTANCES, mem_len, pace=job.turn):
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

    def recall_prompt(self, name, filler, distance, mem_len, state) -> tuple[str, int]:
        """Watch it: (prompt, mem_len) for the Watch tab: the probe of ``distance`` up to
        its first scored character, so that one Step with memory (``mem_len``) predicts
        that very character from the memory the probe's read had there."""
        _, name, filler, mem_len = self.recall_check(name, filler, mem_len, state)
        with user_errors():
            k = as_int("k", distance, 1, max(DISTANCES))
        text, start = probe_text(name, filler, k)
        return text[:start], mem_len

    def score_moments(self, state: UserState | None):
        """After a Score: where memory mattered (webapp.viz.moments_view: the text shaded by
        the bits memory saved over the sliding window, the five moments) and the Watch-it
        choices, of this session's last Score with a sliding window (None and no choices
        when there is none: a text too long for the window, or no Score yet)."""
        scored = state.scored if state is not None and not state.expired else None
        if scored is None:
            return None, gr.Dropdown(choices=[], value=None, interactive=False)
        moments, unit = scored.moments(), state.model.tokenizer.unit
        choices = viz.moment_choices(moments, unit)
        return viz.moments_view(scored, moments, unit), gr.Dropdown(
            choices=choices, value=choices[0][1] if choices else None, interactive=True
        )

    def moment_prompt(self, state: UserState | None, position) -> tuple[str, int, int]:
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
        tokenizer = state.model.tokenizer
        unknown = "replace" if tokenizer.unk_symbol is not None else "ignore"  # as Session
        token = tokenizer.encode("".join(pieces[: position + 1]), errors=unknown)[-1]
        return "".join(pieces[:position]), scored.mem_len, token

    def watch_moment(self, state: UserState, position, settings: tuple) -> str:
        """Watch it: this session started on the text before the moment at ``position`` of
        its last Score, memory on at the Score's mem_len (``settings``: temperature,
        top_k, top_p, seed, as apply_settings takes them), the attention of the prompt's
        last token captured (where the model looked for the moment), and the moment's
        own token left for the next Step to write. Returns the prompt."""
        prompt, mem_len, token = self.moment_prompt(state, position)
        with self.using(state, mem_len):
            s = state.session
            self.apply_settings(s, True, mem_len, *settings)
            self.start(s, prompt, capture=True)
            state.replay = (s.prompt, len(s.ids), token)
        return prompt

    @staticmethod
    def replayed_token(state: UserState, prompt) -> int | None:
        """The token Watch it left for this Step, while the session still holds the
        prompt Watch it started and nothing after it (then once: the Step consumes it)."""
        replay, state.replay = state.replay, None
        if replay is None:
            return None
        at_prompt, n_tokens, token = replay
        s = state.session
        return token if at_prompt == (prompt or "") == s.prompt and len(s.ids) == n_tokens else None

    @staticmethod
    def restore_note(state: UserState) -> str:
        """For the status line: the memory came back from disk in this request."""
        if state.restored_s is None:
            return ""
        return (
            f" · memory restored from disk in {state.restored_s * 1e3:,.0f} ms "
            "(idle sessions' memories wait there while the server is busy)"
        )

    @staticmethod
    def check_room(s: Session) -> None:
        """Continue and Step stop at MAX_TEXT_CHARS: the text is sent whole with every
        answer, and kept in memory for the session's life."""
        if len(s.text) >= MAX_TEXT_CHARS:
            raise ValueError(
                f"the text is {len(s.text):,} characters, the most one session holds "
                f"({MAX_TEXT_CHARS:,}): Reset, or Generate to start over from the prompt"
            )

    def apply_settings(self, s: Session, memory, mem_len, temperature, top_k, top_p, seed):
        """Validate every setting first, then apply (memory rebuilds only on a change)."""
        temperature, top_p, seed = (
            check_temperature(temperature),
            check_top_p(top_p),
            check_seed(seed),
        )
        top_k = as_int("top_k", top_k, 0, 1_000_000)
        mem_len = as_int("mem_len", mem_len, 0, MAX_MEM_LEN)
        cap = self.mem_cap(s.model)
        if mem_len > cap:
            gr.Warning(f"mem_len {mem_len:,} is above this model's per-session cap; using {cap:,}.")
            mem_len = cap
        s.temperature, s.top_k, s.top_p = temperature, top_k, top_p
        if mem_len != s.mem_len:
            s.set_mem_len(mem_len)
            self.fit_history(s)
        s.set_memory(bool(memory))
        if seed != s.seed:
            s.set_seed(seed)

    @staticmethod
    def start(s: Session, prompt: str, capture: bool = False) -> None:
        prompt = prompt or ""
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(
                f"the prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}"
            )
        dropped = s.start(prompt, capture)
        if dropped:
            how = (
                "replaced by " + repr(s.tokenizer.unk_symbol)
                if s.unknown_mode == "replace"
                else "dropped"
            )
            shown = ", ".join(repr(c) for c in dropped[:12])
            gr.Warning(f"Characters the model does not know were {how}: {shown}")

    def model_info(self) -> str:
        if self.default_model is None:
            return f"**No model loaded**: {self.load_error}"
        model = self.default_model
        return model_markdown(display_source(self.default_source), model, self.mem_cap(model))


# Each session's key for its running probe, apart from the session itself (the key of its
# Score): Traffic keeps one job per key, so a probe and a Score do not cancel each other.
_RECALL_OWNERS: weakref.WeakKeyDictionary[UserState, object] = weakref.WeakKeyDictionary()
_RECALL_OWNERS_LOCK = threading.Lock()  # the click and the probe may ask at once


def recall_owner(state: UserState) -> object:
    with _RECALL_OWNERS_LOCK:
        return _RECALL_OWNERS.setdefault(state, object())


def display_source(source: str) -> str:
    """The bundled model's path as typed (relative), any other source as it is."""
    bundled = str(ROOT / BUNDLED_MODEL)
    return BUNDLED_MODEL if source == bundled else source
