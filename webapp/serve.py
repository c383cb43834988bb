"""The demo's service, without the page: models loaded once and shared, each visitor's
state and its expiry, the memory budget and the long work beside the Steps, and what every
handler does before and after calling a Session (find the visitor's state, check and apply
the settings, start from the prompt). ``app.py`` builds one ``DemoService`` and hands it to
each tab (webapp/tabs/), whose handlers call it; nothing here builds a page component, and
everything here can be tested without a browser. Inputs are checked by webapp/inputs.py.

Environment: TXL_MODEL (model to load first), TXL_MAX_SESSIONS, TXL_SESSION_TTL,
TXL_MAX_PARAMS, TXL_DTYPE, TXL_SESSION_MEMORY_MB, TXL_MODEL_DIRS, TXL_MEMORY_BUDGET_MB,
TXL_OFFLOAD_DISK_MB: see app.py's docstring (and webapp/budget.py for the last two).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

import gradio as gr
import torch

from txl.config import TXLConfig
from txl.hub import CONFIG_NAME, TXLLoadError
from txl.loading import load_config
from txl.model import TransformerXL
from txl.session import Session, memory_bytes_per_position

from .budget import (
    MemoryBudget,
    default_budget_bytes,
    growth_bytes,
    memory_cap,
    note_heap_use,
    trim_memory,  # the sweep's; it lives with the allocator settings now
    tune_allocator,
)
from .inputs import as_int
from .longwork import Traffic
from .visitors import Visitors, VisitorState, user_errors

ROOT = Path(__file__).resolve().parents[1]  # the repository: app.py and weights/ live here
BUNDLED_MODEL = "weights/shakespeare-char"
MAX_MEM_LEN = 2048
MAX_PROMPT_CHARS = 20_000
MAX_GENERATE = 500  # tokens one Generate may write (the Watch tab's, the pair's)
HISTORY_STEPS = 256  # steps whose attention a session keeps for the history slider
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


# ---- the service: models, visitors, settings -----------------------------------------


@dataclass(frozen=True)
class Settings:
    """The sampling and memory settings a Watch-tab event sends, as sent (checked when
    applied: ``DemoService.apply_settings``). The handlers take them one by one, as Gradio
    passes the inputs (the API names them by the handler's parameters), and ``of`` reads
    them out of the handler's inputs: the one place a Settings is built from them."""

    memory: bool
    mem_len: int
    temperature: float
    top_k: int
    top_p: float
    seed: int

    @classmethod
    def of(cls, inputs: dict) -> Settings:
        """The settings among a handler's inputs by name (its ``locals()``: parameters
        named as these fields)."""
        return cls(**{f.name: inputs[f.name] for f in fields(cls)})


class DemoService:
    """The default model, the model cache, the visitors' states, the memory budget and the
    long work: what every tab shares. Each tab (webapp/tabs/) holds one and calls it."""

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
        self.visitors = Visitors(env_int("TXL_SESSION_TTL", 3600), on_release=self.budget.release)
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

    def new_state(self, source: str, model: TransformerXL) -> VisitorState:
        session = Session(model, mem_len=self.start_mem_len(model), history=HISTORY_STEPS)
        self.fit_history(session)
        return VisitorState(source=source, session=session)

    def model_for(self, state: VisitorState | None) -> TransformerXL:
        """The visitor's model, or the default one before the visitor's first event (or
        after its state expired); the page's message when no model is loaded."""
        model = state.model if state is not None and not state.expired else self.default_model
        if model is None:
            raise gr.Error(f"No model is loaded ({self.load_error}). Load one above.")
        return model

    def ensure(self, state: VisitorState | None) -> VisitorState:
        """The caller's state, created on first use with the default model (and again
        when Visitors freed it after TXL_SESSION_TTL idle seconds)."""
        if state is not None and state.expired:
            gr.Warning(
                f"This session was idle for more than {self.visitors.ttl:g} s and its text "
                "was cleared: starting again."
            )
            state = None
        if state is not None:
            state.last_used = time.monotonic()
            return state
        model = self.model_for(None)  # the default one, or the page's message
        return self.visitors.add(self.new_state(self.default_source, model))

    @contextmanager
    def using(self, state: VisitorState, mem_len=None, steps=0, grows: bool = True):
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

    def apply_settings(self, s: Session, settings: Settings) -> None:
        """The app's bounds on top_k and mem_len (a mem_len above the per-session cap is
        lowered to it, with a warning), then ``Session.configure``, which checks every
        setting before it changes any (the memory rebuilds only on a change)."""
        top_k = as_int("top_k", settings.top_k, 0, 1_000_000)
        mem_len = as_int("mem_len", settings.mem_len, 0, MAX_MEM_LEN)
        cap = self.mem_cap(s.model)
        if mem_len > cap:
            gr.Warning(f"mem_len {mem_len:,} is above this model's per-session cap; using {cap:,}.")
            mem_len = cap
        changed = mem_len != s.mem_len
        s.configure(
            memory=bool(settings.memory),
            mem_len=mem_len,
            temperature=settings.temperature,
            top_k=top_k,
            top_p=settings.top_p,
            seed=settings.seed,
        )
        if changed:
            self.fit_history(s)

    @staticmethod
    def start_from_prompt(s: Session, prompt: str, capture: bool = False) -> None:
        """The session's text starts over from ``prompt`` (unknown characters replaced or
        dropped, and the page told which)."""
        warn_unknown(s, s.start(check_prompt(prompt), capture))

    def load(self, source: str, state: VisitorState | None, progress=None) -> VisitorState:
        """Load a model (a folder or a Hub repo id) for this visitor only: the same
        VisitorState, so that a Generate still running cannot bring back the old model when
        it ends; the sampling settings are kept. On failure (TXLLoadError) the current
        model stays."""
        if not allowed_folder(resolve_source(source), self.model_dirs):
            raise TXLLoadError(
                f"{source!r} is a folder outside the ones this app may read models from "
                "(set TXL_MODEL_DIRS to allow it); a Hub repo id looks like 'org/name'"
            )
        model = self.cache.get(source, progress)
        new = self.new_state(resolve_source(source), model)
        if state is None or state.expired:
            return self.visitors.add(new)
        with user_errors(state):
            old, s = state.session, new.session
            s.configure(old.memory, None, old.temperature, old.top_k, old.top_p)
            s.set_seed(old.seed)
            state.source, state.session = new.source, s
        return state


def check_prompt(prompt: str | None) -> str:
    """The prompt as text, or a ValueError when it is longer than MAX_PROMPT_CHARS."""
    prompt = prompt or ""
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(
            f"the prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}"
        )
    return prompt


def warn_unknown(s: Session, dropped: list[str]) -> None:
    """Tell the page which characters of a prompt the model does not know (and what
    became of them: ``Session.start``'s unknowns)."""
    if dropped:
        how = (
            "replaced by " + repr(s.tokenizer.unk_symbol)
            if s.unknown_mode == "replace"
            else "dropped"
        )
        shown = ", ".join(repr(c) for c in dropped[:12])
        gr.Warning(f"Characters the model does not know were {how}: {shown}")


def display_source(source: str) -> str:
    """The bundled model's path as typed (relative), any other source as it is."""
    bundled = str(ROOT / BUNDLED_MODEL)
    return BUNDLED_MODEL if source == bundled else source
