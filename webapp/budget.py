"""One memory budget for the whole server, and the disk that stretches it.

Every session's keys and values, pending logits, step history and records (its text,
predictions, ...), and the caches the models keep for their sessions (the table of
position keys, which grows with the longest memory served) count against one budget
(TXL_MEMORY_BUDGET_MB). Before a request runs, the budget makes room for the most
that session can hold by the end of it; if the sessions in RAM would not fit, the
memories of the least recently used idle sessions are written to disk (safetensors
files in a private temporary folder) and dropped from RAM. A session whose memory is on
disk reads it back on its next use, bit for bit: it continues token for token and logit
for logit as if it had never left. Its text, settings, sampler and records never leave
RAM (``Session.footprint`` still counts them then); only ``Session.export_state``'s
tensors do. The budget reads a session through those calls alone, never its fields.

When no room can be made (everyone else is busy, the disk budget TXL_OFFLOAD_DISK_MB is
full, or one session alone needs more than the whole budget), the request is refused
with a BudgetError (a ValueError: the app shows its message) before anything changes.

Locks: a request holds its session's own lock and then takes the budget's lock; the
budget, holding its lock, only ever *tries* another session's lock (never waits for it),
and skips a session that is busy. So neither can wait for the other: no deadlock.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import load_file, save_file

from txl.cached import position_table_bytes, position_table_growth
from txl.session import Session, memory_bytes_per_position

MB = 2**20
BUDGET_SHARE = 0.5  # default budget: half the machine's (or the container's) memory
DISK_SHARE = 0.5  # default disk budget: half the free space of the offload folder's disk


# ---- the allocator: memory that sessions free must go back to the OS ------------------

try:  # glibc only; elsewhere (musl, macOS, Windows) these are no-ops
    _libc = ctypes.CDLL(None)
    _malloc_trim, _mallopt = _libc.malloc_trim, _libc.mallopt
except (AttributeError, OSError):
    _malloc_trim = _mallopt = None

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # mallopt (glibc's malloc.h)
MMAP_THRESHOLD = 32 * MB  # glibc's largest: only blocks above it get their own mapping
TRIM_THRESHOLD = 64 * MB  # free() leaves the heap's top alone: trim_memory() returns it


def trim_memory() -> None:
    """glibc keeps the memory that Python and torch free in its arenas, so a server's RSS
    stays at its peak after the sessions that made it are gone; malloc_trim returns it
    (measured after 200 sessions expired: +42 % without, +2 % with; tests/test_concurrency):
    every free page inside the heaps of every arena, and the main arena's top (not the
    top of any other arena's heap: hence one arena, see tune_allocator)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


_heap_used = threading.Event()


def note_heap_use() -> None:
    """A request ran (it may have left freed blocks in the heap): the next
    ``trim_if_used`` returns them. Cheap: called at the end of every request."""
    _heap_used.set()


def trim_if_used() -> None:
    """trim_memory() if any request ran since the last call (the session sweep calls this
    every second)."""
    if _heap_used.is_set():
        _heap_used.clear()
        trim_memory()


def tune_allocator(
    arenas: int = 1, mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD
) -> None:
    """Call once, before the server's threads start. Settings that keep a session's RSS
    near its tensors (benchmarks/bench_soak.py --per-session) without slowing the model
    calls (benchmarks/bench_score.py --allocator):

    - glibc gives each thread that allocates its own arena (up to 8 per core); every
      Gradio worker thread that ran a model call would keep freed memory in its own.
      One arena, the main one: malloc_trim returns the free pages inside every arena's
      heaps but the top of the main arena's only, so a second arena (two, the setting
      before issue 27) kept the free top of its current heap (up to 64 MB) resident.
      Whether the sessions' buffers went there varied from run to run: the RSS after
      the 30-session run (mem_len 2048, a 400 MB budget) came out 1.00-1.10x the budget
      with two arenas, 1.02x every time with one. Model calls release the GIL but
      allocate little: two sessions feeding and stepping at once in one process run as
      fast with one arena as with two (1.04x / 1.08x and 0.92x / 0.95x in two runs on
      the loaded 2-core machine: noise; ``bench_soak.py --arenas``). glibc's
      MALLOC_ARENA_MAX=1 in the environment does the same from the process's start.
    - Blocks are served from the heap, where a freed block is reused by the next model
      call: a fixed mmap threshold of 256 KB (the first design) gave every larger
      activation its own mapping, mapped, faulted in page by page and unmapped again in
      every forward pass: 10-40 % of a segment's time. glibc's default raises its
      threshold as blocks are freed, so that the first sessions' buffers are mapped and
      later ones are not: fixed at 32 MB it is the same for every session.
    - What the heap holds beyond the live tensors is handed back by trim_memory(): free
      pages anywhere in the heap, not only at its top. free() does not trim (the
      threshold is high: trimming there costs page faults in the next call); the session
      sweep trims once a second after any request (``note_heap_use``/``trim_if_used``),
      and right after sessions expire or are offloaded.
    """
    if _mallopt is not None:
        _mallopt(M_ARENA_MAX, arenas)
        _mallopt(M_MMAP_THRESHOLD, mmap_threshold)
        _mallopt(M_TRIM_THRESHOLD, trim_threshold)


# ---- defaults from the machine -----------------------------------------------------


def machine_memory_bytes() -> int:
    """The memory this process may use: the container's limit (cgroup v2 or v1) when it
    has one, else the machine's."""
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(limit).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and int(value) < 2**60:  # "max" or a huge number: no limit
            return int(value)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_budget_bytes() -> int:
    """TXL_MEMORY_BUDGET_MB, else half the memory: the other half is for the model(s),
    Python, Gradio and each session's text and compute."""
    value = os.environ.get("TXL_MEMORY_BUDGET_MB", "").strip()
    return int(float(value) * MB) if value else int(BUDGET_SHARE * machine_memory_bytes())


def default_disk_bytes(folder: Path) -> int:
    """TXL_OFFLOAD_DISK_MB, else half the free space of the offload folder's disk."""
    value = os.environ.get("TXL_OFFLOAD_DISK_MB", "").strip()
    return int(float(value) * MB) if value else int(DISK_SHARE * shutil.disk_usage(folder).free)


# ---- what one request may add -------------------------------------------------------


def growth_bytes(session: Session, mem_len: int, steps: int) -> int:
    """The most a request can add to the server's RAM, run on ``session`` with memory
    length mem_len and taking ``steps`` steps: what the session may add
    (``Session.growth``), and a new table of position keys when the model's is too short
    for this memory (the old one is freed once the new one is built)."""
    table = position_table_growth(session.model, mem_len + session.seg_len)
    return session.growth(mem_len, steps) + table


def resident_bytes(session: Session) -> int:
    """What a session holds in RAM now (``Session.footprint``), its memory in or out."""
    return session.footprint().total


# ---- what a model keeps for its sessions ----------------------------------------------


def model_cache_bytes(model) -> int:
    """Bytes a model keeps beside its weights for its sessions' steps, which they make
    grow: the table of position keys (txl.cached.position_keys: W_r R per layer for every
    distance up to twice the longest memory + segment it has served; 15-26 MB for the
    bundled model once a session used mem_len 2048). Shared by all the model's sessions
    and never freed while the model lives, so it is counted once per model."""
    return position_table_bytes(model)


# ---- what one session may keep ----------------------------------------------------------


def memory_cap(model, budget_bytes: int) -> int:
    """The most memory positions one session may keep within budget_bytes, counting the
    KV buffers' 25 % spare room. (The WikiText-103 model's memory of 1,600 positions takes
    236 MB in float32, 118 MB in bfloat16.)"""
    return int(budget_bytes / (1.25 * memory_bytes_per_position(model)))


# ---- the budget ------------------------------------------------------------------------


class BudgetError(ValueError):
    """No room for the request; nothing was changed."""


@dataclass(eq=False)
class _Account:
    """One session's standing with the budget."""

    lock: threading.Lock  # the session owner's lock: held while the session is in use
    # bytes in RAM after its last request (while on disk: what stays, its records and the
    # last step's attention)
    resident: int = 0
    peak: int | None = None  # while a request runs: the most it may hold until its end
    path: Path | None = None  # its memory's file while on disk
    file_bytes: int = 0  # that file's size
    unloaded_bytes: int = 0  # what it held in RAM when it went to disk (all of it)
    last_used: int = 0  # a counter: the lowest is the least recently used
    remove_file: weakref.finalize | None = field(default=None, repr=False)

    def held(self) -> int:
        """What it counts against the budget now."""
        return self.peak if self.peak is not None else self.resident


class MemoryBudget:
    """The server's sessions' memory, within ``limit`` bytes of RAM and ``disk_limit``
    bytes of offload files: each session's (``resident_bytes``) and, once for each
    model they use, the model's caches (model_cache_bytes). Sessions and models are held
    weakly: a session the app drops takes its account with it, and its file is removed
    when it is garbage-collected; a model dropped from the cache takes its caches."""

    def __init__(self, limit: int, disk_limit: int | None = None, folder: str | None = None):
        self.limit = int(limit)
        # mkdtemp: a fresh folder only this user can read (0700).
        self.folder = Path(tempfile.mkdtemp(prefix="txl-offload-", dir=folder))
        self.disk_limit = default_disk_bytes(self.folder) if disk_limit is None else disk_limit
        self._accounts: weakref.WeakKeyDictionary[Session, _Account] = weakref.WeakKeyDictionary()
        # each model's caches, as counted at the end of its sessions' last request
        self._models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._clock = itertools.count(1)
        self.offloads = self.restores = 0
        self.restore_seconds: list[float] = []  # every restore's time (for benchmarks)
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.folder), True)

    # -- what the budget holds --

    def in_ram(self) -> int:
        """Bytes counted in RAM now (requests running count their peak), the models'
        caches included."""
        with self._lock:
            return sum(a.held() for a in list(self._accounts.values())) + self._models_bytes()

    def models_bytes(self) -> int:
        """Bytes of the models' caches counted now (part of in_ram)."""
        with self._lock:
            return self._models_bytes()

    def _models_bytes(self) -> int:
        return sum(list(self._models.values()))

    def on_disk(self) -> int:
        with self._lock:
            return sum(a.file_bytes for a in list(self._accounts.values()))

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("*.safetensors"))

    def is_offloaded(self, session: Session) -> bool:
        account = self._accounts.get(session)
        return account is not None and account.path is not None

    # -- a request --

    @contextmanager
    def use(self, session: Session, lock: threading.Lock, growth: int):
        """Run a request on ``session``, whose ``lock`` the caller holds: make room for
        what it holds plus ``growth`` bytes (offloading others), read its memory back
        from disk if it was there, and count what it holds afterwards. Yields the seconds
        the read-back took, or None. Raises BudgetError, with nothing changed, when the
        room cannot be made."""
        with self._lock:
            account = self._accounts.get(session)
            if account is None:
                account = self._accounts[session] = _Account(lock=lock)
            account.lock = lock  # the owner's lock (the same, unless the owner changed)
            now = account.unloaded_bytes if account.path else resident_bytes(session)
            need = now + growth
            self._make_room(need, session)
            self._models[session.model] = model_cache_bytes(session.model)
            account.peak, account.last_used = need, next(self._clock)
            path = account.path
        restored = None
        try:
            if path is not None:  # outside the budget's lock: the session's lock is ours
                t0 = time.perf_counter()
                try:
                    session.import_state(load_file(path))
                except Exception as e:  # the file is gone or damaged: start the memory over
                    session.reset()  # (which forgets the memory that was on disk)
                    with self._lock:
                        self._forget_file(account)
                    raise BudgetError(
                        f"this session's memory could not be read back from disk ({e}); "
                        "its text and memory were cleared: start again"
                    ) from None
                restored = time.perf_counter() - t0
                with self._lock:
                    self._forget_file(account)
                    self.restores += 1
                    self.restore_seconds.append(restored)
            yield restored
        finally:
            with self._lock:
                # (unloaded: the file could not be read and nothing was restored; what
                # stays in RAM of an unloaded session still counts)
                account.resident = resident_bytes(session)
                account.peak, account.last_used = None, next(self._clock)
                self._models[session.model] = model_cache_bytes(session.model)

    def release(self, session: Session) -> None:
        """Forget a session (it expired or was reset): its file goes at once."""
        with self._lock:
            account = self._accounts.pop(session, None)
            if account is not None:
                self._forget_file(account)

    # -- under the budget's lock --

    def _make_room(self, need: int, session: Session) -> None:
        models = self._models_bytes()  # offloading frees none of it
        if session.model not in self._models:  # the first request on this model
            models += model_cache_bytes(session.model)
        if need + models > self.limit:
            beside = f" beside the models' caches ({megabytes(models)})" if models else ""
            raise BudgetError(
                f"this request needs up to {megabytes(need)} for this session's memory"
                f"{beside}, more than the server's whole memory budget "
                f"({megabytes(self.limit)}, TXL_MEMORY_BUDGET_MB): lower mem_len (or switch "
                "the memory off) and try again"
            )
        accounts = [(s, a) for s, a in list(self._accounts.items()) if s is not session]
        total = need + models + sum(a.held() for _, a in accounts)
        if total <= self.limit:
            return
        disk = sum(a.file_bytes for _, a in accounts)
        disk_full = offloaded = False
        idle = [(a.last_used, s, a) for s, a in accounts if a.peak is None and a.path is None]
        for _, other, account in sorted(idle, key=lambda entry: entry[0]):
            if total <= self.limit:
                break
            if disk + account.resident > self.disk_limit:
                disk_full = True
                continue
            if not account.lock.acquire(blocking=False):  # in use right now: leave it
                continue
            try:
                if account.peak is not None or other.exported:
                    continue
                freed = self._offload(other, account)
            finally:
                account.lock.release()
            total -= freed
            disk += account.file_bytes
            offloaded = True
        if offloaded:
            trim_memory()  # what the offloaded sessions held goes back to the OS now
        if total > self.limit:
            why = (
                "the disk space for idle sessions' memories (TXL_OFFLOAD_DISK_MB) is full"
                if disk_full
                else "the other sessions' memories are in use right now"
            )
            raise BudgetError(
                f"The server is full: its memory budget ({megabytes(self.limit)}) cannot "
                f"make room for this session's memory ({megabytes(need)}) because {why}. "
                "Your text and memory are unchanged: try again in a moment, or use a shorter "
                "mem_len."
            )

    def _offload(self, session: Session, account: _Account) -> int:
        """Write the session's memory to a file and drop it from RAM; the bytes freed.
        What stays in RAM (its records, the last step's attention) stays counted."""
        path = self.folder / f"{uuid.uuid4().hex}.safetensors"
        held = resident_bytes(session)
        tensors = session.export_state()
        try:
            save_file(tensors, str(path))
        except BaseException:
            session.import_state(tensors)  # the disk refused it: the memory stays in RAM
            path.unlink(missing_ok=True)
            raise
        del tensors
        account.path, account.file_bytes = path, path.stat().st_size
        account.unloaded_bytes, account.resident = held, resident_bytes(session)
        freed = held - account.resident
        # The file goes with the session when the app drops it without a release().
        account.remove_file = weakref.finalize(session, _remove, path)
        self.offloads += 1
        return freed

    @staticmethod
    def _forget_file(account: _Account) -> None:
        if account.remove_file is not None:
            account.remove_file()  # removes the file once; detaches the finalizer
        account.path, account.file_bytes, account.unloaded_bytes = None, 0, 0
        account.remove_file = None


def megabytes(n: int) -> str:
    return f"{n / MB:,.0f} MB" if n >= 10 * MB else f"{n / MB:.2f} MB"


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
