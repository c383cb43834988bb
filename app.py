"""See what Transformer-XL's recurrent memory does: a Gradio app.

    python app.py                      # http://127.0.0.1:7860, the bundled model
    TXL_MODEL=org/name python app.py   # a Hub repo id (or another folder)

This file only builds the page and wires events: the text, memory and sampling live in
``txl.session.Session`` (one per browser session, in ``gr.State``), the figures in
``txl.viz``. The model itself is loaded once per source and shared read-only.

Environment: TXL_MODEL (model to load first), GRADIO_SERVER_NAME / GRADIO_SERVER_PORT,
TXL_CONCURRENCY (events run at once, default 4), TXL_MAX_SESSIONS (browser sessions kept,
default 200), TXL_SESSION_TTL (seconds a session lives after its last use, default 3600),
TXL_MAX_PARAMS (largest model the Load box accepts, default 400M parameters: the
WikiText-103 model has 285M), TXL_DTYPE (float32, bfloat16, or auto: bfloat16 for models
over 100M parameters, the default), TXL_SESSION_MEMORY_MB (the most memory one session's
Transformer-XL memory may take, default 256: it caps mem_len for big models),
TXL_TORCH_THREADS (torch threads per model call, default 1), TXL_MODEL_DIRS (folders,
separated by os.pathsep, besides the app's own, that the Load box may read models from).
"""

from __future__ import annotations

import os

# Before gradio / huggingface_hub are imported: no analytics, no telemetry.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Gradio recomputes a pandas summary of its last 10,000 events after every event, for its
# monitoring page: 20 ms of CPU per event once that many ran (a Step costs less). Every
# 100 events is plenty.
os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", "100")

import ctypes  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import weakref  # noqa: E402
from collections import OrderedDict  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import gradio as gr  # noqa: E402
import torch  # noqa: E402

from txl import TransformerXL, TXLConfig, viz  # noqa: E402
from txl.hub import CONFIG_NAME, TXLLoadError  # noqa: E402
from txl.session import (  # noqa: E402
    Session,
    check_seed,
    check_temperature,
    check_top_p,
    memory_bytes_per_position,
    memory_cap,
)

ROOT = Path(__file__).resolve().parent
BUNDLED_MODEL = "weights/shakespeare-char"
MAX_NEW_TOKENS = 500  # per Generate call
MAX_MEM_LEN = 2048
MAX_PROMPT_CHARS = 20_000
MAX_SCORE_CHARS = 20_000
MAX_TEXT_CHARS = 100_000  # a session's text: Continue and Step stop here (Reset starts over)
MAX_SOURCE_CHARS = 256  # the Load box: a Hub id is at most 96 + 1 + 96 characters
MODEL_CACHE_SIZE = 3  # models kept loaded besides those that live sessions still use
STREAM_EVERY_S = 0.08  # Generate sends the text at most this often
HEATMAP_COLUMNS = 160  # more keys than this are summed into buckets (mem_len 128 + 1 fits)
ALL_LAYERS, MEAN_HEADS = "all layers", "mean over heads"
BUTTONS = [
    ("generate", "primary"),
    ("continue", "secondary"),
    ("step", "secondary"),
    ("reset", "stop"),
]
EMPTY_HEATMAP = "Step or Generate to see where the newest token looks."


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
    config = TransformerXL.load_config(source)
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

    @property
    def model(self) -> TransformerXL:
        return self.session.model


try:  # glibc: hand freed heap pages back to the OS
    _malloc_trim = ctypes.CDLL(None).malloc_trim
except (AttributeError, OSError):  # musl, macOS, Windows: nothing to do
    _malloc_trim = None


def trim_memory() -> None:
    """glibc keeps the memory that Python and torch free in its arenas, so a server's RSS
    stays at its peak after the sessions that made it are gone; malloc_trim returns it
    (measured after 200 sessions expired: +42 % without, +2 % with; tests/test_concurrency)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


class Sessions:
    """Every UserState of the app, held weakly, and what frees them.

    Gradio drops a state ``time_to_live`` seconds after it was last stored (calling
    delete_callback), drops the states beyond ``state_session_capacity`` without calling
    it, and is written to keep a closed tab's state for an hour whatever the time_to_live
    (with Starlette 1.x it does not notice the close). So a sweep every second frees the
    text and memory of every session idle for ``ttl`` seconds itself, and hands the freed
    memory back to the OS whenever a session was released or dropped.
    """

    def __init__(self, ttl: float, every: float = 1.0):
        self.ttl, self.every = ttl, every
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


# ---- the app -------------------------------------------------------------------------


class TXLApp:
    """Handlers (small: they call Session and txl.viz) and the Blocks that wires them."""

    def __init__(
        self,
        default_source: str | None = None,
        cache: ModelCache | None = None,
        model_dirs: list[str] | None = None,
    ):
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
        self.sessions = Sessions(env_int("TXL_SESSION_TTL", 3600))
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

    # -- state and settings --

    def mem_cap(self, model: TransformerXL) -> int:
        """The largest mem_len a session of this model may use (MAX_MEM_LEN, or less when
        TXL_SESSION_MEMORY_MB would be exceeded: 18 layers x 1600 positions is 236 MB)."""
        budget = float(os.environ.get("TXL_SESSION_MEMORY_MB") or 256) * 2**20
        return max(1, min(MAX_MEM_LEN, memory_cap(model, budget)))

    def start_mem_len(self, model: TransformerXL) -> int:
        """A new session's mem_len: the model's own, within the per-session cap."""
        return min(model.config.mem_len, self.mem_cap(model))

    def new_state(self, source: str, model: TransformerXL) -> UserState:
        session = Session(model, mem_len=self.start_mem_len(model))
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
        s.set_memory(bool(memory))
        if seed != s.seed:
            s.set_seed(seed)

    @staticmethod
    def start(s: Session, prompt: str) -> None:
        prompt = prompt or ""
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ValueError(
                f"the prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}"
            )
        dropped = s.start(prompt)
        if dropped:
            how = (
                "replaced by " + repr(s.tokenizer.unk_symbol)
                if s.unknown_mode == "replace"
                else "dropped"
            )
            shown = ", ".join(repr(c) for c in dropped[:12])
            gr.Warning(f"Characters the model does not know were {how}: {shown}")

    # -- views --

    def text_views(self, s: Session) -> tuple[str, str, str]:
        """(plain text, coloured HTML, status line) of the session now."""
        info = s.memory_info()
        t, n = s.last_trace, len(s.ids)
        fresh = (
            t is not None
            and t.position == n - 1
            and t.memory == info["memory"]
            and t.memory_tokens == info["tokens"]
        )
        roles = viz.roles_from_trace(n, t) if fresh else viz.roles_from_info(n, info)
        unit = s.tokenizer.unit
        html = viz.text_html(s.pieces, roles, memory=info["memory"], unit=unit)
        status = viz.status_markdown(info, n, t.latency_ms if fresh else None, unit=unit)
        return s.text, html, status

    def attention_views(self, state: UserState, layer, head):
        """(heatmap, memory-share bars, step summary) of the last step."""
        s, t = state.session, state.session.last_trace
        if t is None or t.attentions is None:
            empty = viz.placeholder_figure(EMPTY_HEATMAP)
            return empty, viz.placeholder_figure("", height=120), None
        c = s.model.config
        layer, head = parse_choice(layer, "layer", c.n_layer), parse_choice(head, "head", c.n_head)
        heat = viz.heatmap_from_trace(t, s.pieces, layer, head, max_cols=HEATMAP_COLUMNS)
        # Attention on text a model without memory could not see: seg_len or more back.
        n_far = viz.far_keys(t.key_positions, t.position, s.seg_len)
        mass = viz.memory_mass_figure(t.attentions, t.n_memory, t.memory, n_far, s.seg_len)
        return heat, mass, viz.step_summary(t, s.memory_info(), far=s.seg_len)

    def all_views(self, state: UserState, layer, head, started: float | None = None):
        text, html, status = self.text_views(state.session)
        heat, mass, summary = self.attention_views(state, layer, head)
        if summary is not None and started is not None:
            summary["handler_ms"] = round((time.perf_counter() - started) * 1e3, 2)
        return text, html, status, heat, mass, summary, state

    # -- public events --

    def generate(
        self,
        prompt,
        n_tokens,
        memory,
        mem_len,
        temperature,
        top_k,
        top_p,
        seed,
        layer,
        head,
        state,
        fresh=True,
    ):
        """Write n_tokens characters after the prompt (streaming), starting over from the
        prompt with the seed: the same arguments give the same text."""
        state = self.ensure(state)
        s = state.session
        with user_errors(state):
            n = as_int("n_tokens", n_tokens, 1, MAX_NEW_TOKENS)
            self.apply_settings(s, memory, mem_len, temperature, top_k, top_p, seed)
            if fresh or not s.ids or s.prompt != (prompt or ""):
                self.start(s, prompt)
            self.check_room(s)
            last = time.perf_counter()
            for i, _ in enumerate(s.generate(n)):
                if i < n - 1 and time.perf_counter() - last > STREAM_EVERY_S:
                    last = time.perf_counter()
                    yield (*self.text_views(s), gr.skip(), gr.skip(), gr.skip(), state)
            started = time.perf_counter()
            yield self.all_views(state, layer, head, started)

    def continue_(
        self, prompt, n_tokens, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state
    ):
        """Generate n_tokens more characters after the text so far."""
        yield from self.generate(
            prompt,
            n_tokens,
            memory,
            mem_len,
            temperature,
            top_k,
            top_p,
            seed,
            layer,
            head,
            state,
            fresh=False,
        )

    def step(self, prompt, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state):
        """One more character after the text so far (starting from the prompt when the
        text is empty or the prompt was edited)."""
        started = time.perf_counter()
        state = self.ensure(state)
        s = state.session
        with user_errors(state):
            self.apply_settings(s, memory, mem_len, temperature, top_k, top_p, seed)
            if not s.ids or s.prompt != (prompt or ""):
                self.start(s, prompt)
            self.check_room(s)
            s.step()
            return self.all_views(state, layer, head, started)

    def reset(self, state):
        """Forget the text and the memory (the settings stay)."""
        state = self.ensure(state)
        with user_errors(state):
            state.session.reset()
            return self.all_views(state, None, None)

    def score(self, text, mem_len, state):
        """Per-character surprisal of text with and without memory, and the bpc of each."""
        state = self.ensure(state)
        text = text or ""
        if len(text) > MAX_SCORE_CHARS:
            raise gr.Error(
                f"The text is {len(text):,} characters; the limit is {MAX_SCORE_CHARS:,}."
            )
        with user_errors():
            mem_len = min(as_int("mem_len", mem_len, 0, MAX_MEM_LEN), self.mem_cap(state.model))
            scorer = Session(state.model, mem_len=mem_len)  # the user's text stays untouched
            result = scorer.score(text)
        if not result.chars:
            raise gr.Error("Nothing to score: paste at least two characters the model knows.")
        fig = viz.surprisal_figure(
            result.chars,
            result.bits_with,
            result.bits_without,
            result.bpc_with,
            result.bpc_without,
            seg_len=scorer.seg_len,
        )
        summary = viz.score_markdown(result, scorer.seg_len, mem_len, unit=scorer.tokenizer.unit)
        return fig, summary, state

    def load_model(self, source, state, progress=gr.Progress()):  # noqa: B008 (Gradio's way)
        """Load a model (a folder or a Hub repo id) for this browser session only; on
        failure the current model stays."""
        source = (source or "").strip()
        if not source:
            raise gr.Error("Type a folder or a Hub repo id like 'org/name'.")
        if len(source) > MAX_SOURCE_CHARS:
            raise gr.Error(
                f"Could not load the model, keeping the current one. The source is "
                f"{len(source):,} characters: a Hub repo id is 'org/name' (at most 96 "
                f"characters each) and a folder path at most {MAX_SOURCE_CHARS}."
            )
        progress(0.0, desc=f"loading {source}")
        try:
            if not allowed_folder(resolve_source(source), self.model_dirs):
                raise TXLLoadError(
                    f"{source!r} is a folder outside the ones this app may read models from "
                    "(set TXL_MODEL_DIRS to allow it); a Hub repo id looks like 'org/name'"
                )
            model = self.cache.get(source, progress)
        except TXLLoadError as e:
            raise gr.Error(f"Could not load the model, keeping the current one. {e}") from None
        new = self.new_state(resolve_source(source), model)
        if state is None or state.expired:
            state = self.sessions.add(new)
        else:  # the same UserState, so that a Generate still running cannot bring back
            with user_errors(state):  # the old model when it ends; settings are kept
                old, s = state.session, new.session
                s.temperature, s.top_k, s.top_p = old.temperature, old.top_k, old.top_p
                s.set_seed(old.seed)
                s.set_memory(old.memory)
                state.source, state.session = new.source, s
        progress(1.0, desc="ready")
        c = model.config
        return (
            model_markdown(source, model, self.mem_cap(model)),
            *self.all_views(state, None, None),
            gr.Dropdown(**layer_choices(c)),
            gr.Dropdown(**head_choices(c)),
            gr.Slider(value=state.session.mem_len),
            gr.Slider(value=state.session.mem_len),
        )

    # -- private events --

    def settings_changed(
        self, memory, mem_len, temperature, top_k, top_p, seed, layer, head, state
    ):
        """Memory switched on/off or its length changed: rebuild and redraw the text."""
        if state is None:  # nothing generated yet: the settings apply at the first step
            return gr.skip(), gr.skip(), state
        with user_errors(state):
            self.apply_settings(state.session, memory, mem_len, temperature, top_k, top_p, seed)
            return (*self.text_views(state.session)[1:], state)

    def redraw(self, layer, head, state):
        if state is None:
            return gr.skip()
        return self.attention_views(state, layer, head)[0]

    def export(self, state):
        """The last step's attention as a JSON file."""
        t = state.session.last_trace if state is not None else None
        if t is None or t.attentions is None:
            gr.Warning("Nothing to export yet: Step or Generate first.")
            return gr.File(value=None, visible=False)
        for old in self.export_dir.glob("*.json"):  # keep the folder small
            if time.time() - old.stat().st_mtime > 600:
                old.unlink(missing_ok=True)
        path = self.export_dir / f"attention-pos{t.position}-{time.time_ns()}.json"
        export = viz.attention_export(t, state.session.pieces)
        path.write_text(json.dumps(export, ensure_ascii=False))
        return gr.File(value=str(path), visible=True)

    # -- the page --

    def build(self) -> gr.Blocks:
        """The page: a header, the "Watch the memory" tab, the "Does memory help?" tab."""
        ttl = self.sessions.ttl
        with gr.Blocks(title="Transformer-XL memory", delete_cache=(600, 3600)) as demo:
            state = gr.State(None, time_to_live=ttl, delete_callback=self.sessions.release)
            gr.Markdown(HEADER, elem_id="header")
            with gr.Tabs():
                with gr.Tab("Watch the memory", id="watch"):
                    ui = self.watch_tab()
                with gr.Tab("Does memory help?", id="score"):
                    ui.update(self.score_tab())
            self.wire(ui, state)
            api_names = {"score_mem": "mem_len"}  # the score tab's slider
            name_input_errors((api_names.get(k, k), c) for k, c in ui.items())
        return demo

    def watch_tab(self) -> dict:
        """Model source, prompt and buttons, settings, the text (left), attention (right)."""
        c = self.default_model.config if self.default_model else TXLConfig(vocab=["a"])
        mem_len = self.start_mem_len(self.default_model) if self.default_model else c.mem_len
        ui = {}
        with gr.Row():
            shown = _display(self.default_source)
            ui["source"] = gr.Textbox(
                shown, label="Model: a folder or a Hub repo id", scale=4, elem_id="source"
            )
            ui["load"] = gr.Button("Load", scale=1, min_width=90, elem_id="load")
        notice = f"\n\n⚠️ {self.load_notice}" if self.load_notice else ""
        ui["model_info"] = gr.Markdown(
            self.model_info() + notice, label="model", elem_id="model-info"
        )
        with gr.Row(elem_id="main-row"):
            with gr.Column(scale=5, min_width=340, elem_id="left"):
                ui["prompt"] = gr.Textbox(
                    "ROMEO:\n", lines=2, max_lines=6, label="Prompt", elem_id="prompt"
                )
                with gr.Row():
                    for name, variant in BUTTONS:
                        ui[name] = gr.Button(
                            name.title(), variant=variant, elem_id=name, min_width=70, size="md"
                        )
                ui["n_tokens"] = gr.Slider(
                    1,
                    MAX_NEW_TOKENS,
                    value=120,
                    step=1,
                    label="Characters to generate",
                    elem_id="n_tokens",
                )
                ui["status"] = gr.Markdown(
                    "Memory **on** · nothing generated yet", label="memory status", elem_id="status"
                )
                ui["text_html"] = gr.HTML(
                    viz.text_html("", []),
                    label="text by role",
                    max_height=460,
                    autoscroll=True,
                    elem_id="text",
                )
                with gr.Accordion("Memory and sampling", open=True):
                    with gr.Row():
                        ui["memory"] = gr.Checkbox(
                            True, label="Memory (Transformer-XL)", elem_id="memory", min_width=160
                        )
                        ui["mem_len"] = gr.Slider(
                            0,
                            MAX_MEM_LEN,
                            value=mem_len,
                            step=1,
                            label="mem_len",
                            elem_id="mem_len",
                            min_width=160,
                        )
                    with gr.Row():
                        ui["temperature"] = gr.Slider(
                            0,
                            2,
                            value=0.8,
                            step=0.05,
                            min_width=120,
                            label="temperature (0 = greedy)",
                        )
                        ui["top_k"] = gr.Slider(
                            0, 100, value=0, step=1, min_width=120, label="top-k (0 = off)"
                        )
                        ui["top_p"] = gr.Slider(
                            0.05, 1, value=1.0, step=0.05, label="top-p", min_width=120
                        )
                        ui["seed"] = gr.Number(0, precision=0, label="seed", min_width=90)
                with gr.Accordion("Plain text", open=False):
                    ui["text_out"] = gr.Textbox(
                        label="Text so far",
                        lines=6,
                        interactive=False,
                        buttons=["copy"],
                        elem_id="text_out",
                    )
            with gr.Column(scale=6, min_width=340, elem_id="right"):
                with gr.Row():
                    ui["layer"] = gr.Dropdown(**layer_choices(c), label="Layer", min_width=140)
                    ui["head"] = gr.Dropdown(**head_choices(c), label="Head", min_width=140)
                ui["heatmap"] = gr.Plot(
                    viz.placeholder_figure(EMPTY_HEATMAP),
                    show_label=False,
                    label="Attention of the newest token",
                    elem_id="heatmap",
                )
                ui["mass"] = gr.Plot(
                    viz.placeholder_figure("", height=120),
                    show_label=False,
                    label="Attention on memory",
                    elem_id="mass",
                )
                with gr.Row():
                    ui["export"] = gr.Button("Export attention (JSON)", size="sm", elem_id="export")
                    ui["export_file"] = gr.File(
                        label="attention.json", visible=False, elem_id="export_file"
                    )
                with gr.Accordion("Last step (JSON)", open=False):
                    ui["summary"] = gr.JSON(label="summary", elem_id="summary")
                gr.Markdown(HEATMAP_HELP)
        return ui

    def score_tab(self) -> dict:
        """A text, a Score button, the surprisal chart and the bpc with / without memory."""
        mem_len = self.start_mem_len(self.default_model) if self.default_model else 0
        ui = {}
        gr.Markdown(SCORE_HELP)
        with gr.Row():
            with gr.Column(scale=4, min_width=300):
                ui["score_text"] = gr.Textbox(
                    lines=10, max_lines=20, label="Text to score", elem_id="score_text"
                )
                with gr.Row():
                    ui["score_mem"] = gr.Slider(
                        0, MAX_MEM_LEN, value=mem_len, step=1, label="mem_len", min_width=160
                    )
                    ui["score"] = gr.Button(
                        "Score", variant="primary", elem_id="score_btn", min_width=90
                    )
                gr.Examples(
                    [[ROMEO_AND_JULIET], [REPEATED]],
                    inputs=[ui["score_text"]],
                    example_labels=["Romeo and Juliet, the balcony scene", "A quatrain, twice"],
                )
            with gr.Column(scale=6, min_width=300):
                ui["score_md"] = gr.Markdown(label="bits per character", elem_id="score_summary")
                ui["score_plot"] = gr.Plot(
                    show_label=False, label="Surprisal per character", elem_id="score_plot"
                )
        return ui

    def wire(self, ui: dict, state: gr.State) -> None:
        """Events: five public endpoints, the rest private."""
        settings = [ui[k] for k in ("memory", "mem_len", "temperature", "top_k", "top_p", "seed")]
        view = [ui["layer"], ui["head"]]
        views = [ui[k] for k in ("text_out", "text_html", "status", "heatmap", "mass", "summary")]
        views.append(state)
        gen_inputs = [ui["prompt"], ui["n_tokens"], *settings, *view, state]
        model = dict(concurrency_id="model")  # Generate, Continue and Step share a limit

        ui["generate"].click(self.generate, gen_inputs, views, api_name="generate", **model)
        ui["step"].click(
            self.step, [ui["prompt"], *settings, *view, state], views, api_name="step", **model
        )
        ui["reset"].click(self.reset, [state], views, api_name="reset")
        ui["score"].click(
            self.score,
            [ui["score_text"], ui["score_mem"], state],
            [ui["score_plot"], ui["score_md"], state],
            api_name="score",
            concurrency_limit=2,
        )
        ui["load"].click(
            self.load_model,
            [ui["source"], state],
            [ui["model_info"], *views, *view, ui["mem_len"], ui["score_mem"]],
            api_name="load_model",
            concurrency_limit=2,
            show_progress="full",
        )

        private = dict(api_visibility="private")
        ui["continue"].click(
            self.continue_,
            gen_inputs,
            views,
            api_name="continue",
            api_visibility="undocumented",
            **model,
        )
        for event in (ui["memory"].change, ui["mem_len"].release):
            event(
                self.settings_changed,
                [*settings, *view, state],
                [ui["text_html"], ui["status"], state],
                **private,
            )
        for control in view:
            control.change(self.redraw, [*view, state], [ui["heatmap"]], **private)
        ui["export"].click(self.export, [state], [ui["export_file"]], **private)

    def model_info(self) -> str:
        if self.default_model is None:
            return f"**No model loaded**: {self.load_error}"
        model = self.default_model
        return model_markdown(_display(self.default_source), model, self.mem_cap(model))


def layer_choices(config: TXLConfig) -> dict:
    return dict(
        choices=[ALL_LAYERS] + [f"layer {i}" for i in range(config.n_layer)], value=ALL_LAYERS
    )


def head_choices(config: TXLConfig) -> dict:
    return dict(
        choices=[MEAN_HEADS] + [f"head {i}" for i in range(config.n_head)], value=MEAN_HEADS
    )


def _display(source: str) -> str:
    """The bundled model's path as typed (relative), any other source as it is."""
    bundled = str(ROOT / BUNDLED_MODEL)
    return BUNDLED_MODEL if source == bundled else source


def launch(demo: gr.Blocks, **kwargs):
    """queue + launch with the app's limits; keyword arguments override launch()'s."""
    options = dict(
        server_name=os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1",
        server_port=env_int("GRADIO_SERVER_PORT", 7860),
        state_session_capacity=env_int("TXL_MAX_SESSIONS", 200),
        css=CSS,
        footer_links=["api"],
    )
    options.update(kwargs)
    demo.queue(max_size=128, default_concurrency_limit=env_int("TXL_CONCURRENCY", 4))
    return demo.launch(**options)


HEADER = """\
# Transformer-XL: watch the memory
Transformer-XL keeps the hidden states of the last `mem_len` tokens as a **memory** and lets \
each new token attend to them as well as to its own segment, so it sees past the segment \
without recomputing anything. Generate or Step, then see what the newest character looks at, \
and which text has already fallen out of memory.
"""

HEATMAP_HELP = """\
Rows are layers (or the heads of one layer), columns the keys in text order: \
**memory** left of the dashed line, the **current segment** right of it (in step-by-step \
generation the current segment is the new token itself). Beyond 160 keys, columns sum \
buckets of neighbouring keys. The camera icon of the plot saves it as PNG.
"""

SCORE_HELP = """\
Paste a text and score it: the model reads it in segments, once carrying its memory from \
one segment to the next and once with each segment alone. The chart shows the surprisal of \
every character (bits, lower is better); the dotted lines mark segment starts, where the \
memory-less model starts from nothing.
"""

CSS = """
#text .txl-text { min-height: 120px; }
@media (max-width: 720px) {
  #main-row { flex-direction: column; }
  #main-row > div { min-width: 0 !important; width: 100%; }
  #main-row .row > div, #main-row .row > button { min-width: 0 !important; }
}
"""

# Public domain: Shakespeare, Romeo and Juliet, act 2 scene 2 (the balcony scene).
ROMEO_AND_JULIET = """\
ROMEO:
But, soft! what light through yonder window breaks?
It is the east, and Juliet is the sun.
Arise, fair sun, and kill the envious moon,
Who is already sick and pale with grief,
That thou her maid art far more fair than she:
Be not her maid, since she is envious;
Her vestal livery is but sick and green
And none but fools do wear it; cast it off.
It is my lady, O, it is my love!
O, that she knew she were!
She speaks yet she says nothing: what of that?
Her eye discourses; I will answer it.
I am too bold, 'tis not to me she speaks:
Two of the fairest stars in all the heaven,
Having some business, do entreat her eyes
To twinkle in their spheres till they return.
What if her eyes were there, they in her head?
The brightness of her cheek would shame those stars,
As daylight doth a lamp; her eyes in heaven
Would through the airy region stream so bright
That birds would sing and think it were not night.
See, how she leans her cheek upon her hand!
O, that I were a glove upon that hand,
That I might touch that cheek!

JULIET:
Ay me!

ROMEO:
She speaks:
O, speak again, bright angel! for thou art
As glorious to this night, being o'er my head
As is a winged messenger of heaven
Unto the white-upturned wondering eyes
Of mortals that fall back to gaze on him
When he bestrides the lazy-pacing clouds
And sails upon the bosom of the air.

JULIET:
O Romeo, Romeo! wherefore art thou Romeo?
Deny thy father and refuse thy name;
Or, if thou wilt not, be but sworn my love,
And I'll no longer be a Capulet.

ROMEO:
Shall I hear more, or shall I speak at this?

JULIET:
'Tis but thy name that is my enemy;
Thou art thyself, though not a Montague.
What's Montague? it is nor hand, nor foot,
Nor arm, nor face, nor any other part
Belonging to a man. O, be some other name!
What's in a name? that which we call a rose
By any other name would smell as sweet;
So Romeo would, were he not Romeo call'd,
Retain that dear perfection which he owes
Without that title. Romeo, doff thy name,
And for that name which is no part of thee
Take all myself.
"""

# Public domain: Shakespeare, Sonnet 18, its first quatrain twice. The second copy is
# within reach of a 128-token memory: watch its surprisal drop when memory is on.
_QUATRAIN = """\
Shall I compare thee to a summer's day?
Thou art more lovely and more temperate:
Rough winds do shake the darling buds of May,
And summer's lease hath all too short a date.
"""
REPEATED = _QUATRAIN + "\n" + _QUATRAIN


def main() -> None:
    # One thread per model call: events run concurrently, and a step's ops are far too
    # small to split (two threads on busy cores made a step 20x slower in benchmarks).
    torch.set_num_threads(env_int("TXL_TORCH_THREADS", 1))
    app = TXLApp()
    for problem in (app.load_error, app.load_notice):
        if problem:
            print(f"warning: {problem}")
    launch(app.build())


if __name__ == "__main__":
    main()
