"""Long work beside short requests: a Score that takes seconds must not slow the Steps of
everyone else, and should use the cores they leave free.

    traffic = Traffic()                      # one per server

    with traffic.short():                    # every short request (Step, Generate, ...)
        session.step()

    job = traffic.start_job(owner)           # a long request; cancels owner's previous job
    try:
        for chunk in work:                   # small chunks: ~0.1-0.2 s each
            with job.turn():                 # waits its turn, picks its threads
                compute(chunk)
            yield progress                   # a generator handler: Gradio can stop it here
    finally:
        job.close()

The policy, in one place (``Traffic.turn``):

- **Threads.** A chunk of long work runs with ``long_threads`` torch threads (default 2,
  TXL_LONG_THREADS, at most the machine's cores) when no short request is in flight and no
  other long job holds the extra cores; otherwise with ``base_threads`` (1, the app's
  TXL_TORCH_THREADS). Two threads on a busy core made a Step 20x slower: a long job only
  spreads out when the cores are free. Cores can also be held by other processes (a
  shared machine): chunks that are alike (``turn(work=...)``) measure their speed with
  one thread and with two, and two are used only while at least 10 % faster; the other
  count is tried again after PROBE_EVERY chunks, the interval doubling (up to 8x) each
  time the try confirms the choice. Until measured, other chunks take one thread.
  torch's thread count is per OS thread, but a new thread starts with the count last set
  anywhere, so every short request (``short()``) pins its own thread back to
  ``base_threads`` (a no-op when it already is) and every chunk restores its thread.
- **Independent tasks.** A chunk made of independent pieces (the Score's reads of one text
  with several memory lengths: ``turn(tasks=n)``) runs them side by side, one core and
  one torch thread each (``txl.threads.side_by_side``), when the cores are free, and one after the
  other otherwise. No measuring is needed: separate tasks do not wait on each other, so
  they cannot be slowed down the way two threads of one product can; on this 2-core
  machine the balcony scene's two reads took 1.3 s side by side, 1.55 s with two threads
  and 2.3 s with one.
- **Yielding.** While short requests are in flight, a long job works at most
  ``busy_share`` of the time (default 1/3 of one core): after a chunk of t seconds it
  waits up to t * (1 - share) / share, or until no short request is in flight, whichever
  comes first. A machine full of Steps keeps serving them; the long job still advances.
- **Cancelling.** A job ends at its next ``turn()`` after ``cancel()`` (raising
  JobCancelled): when its owner starts another job (a second click of Score), or when the
  handler's generator is closed (the visitor left: Gradio stops iterating it, and the
  ``finally`` closes the job). Work runs only inside the handler's own ``next()``, so
  nothing is left running on the server once the generator stops.

Issue 20's "Inside the attention" tab can use the same pattern for its long work.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from contextlib import contextmanager

import torch

from txl.threads import torch_threads

PROBE_EVERY = 8  # every 8th chunk on free cores measures the thread count not in use


class JobCancelled(Exception):
    """The job was cancelled (its owner started another one, or closed it)."""


def env_threads(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return max(1, int(value)) if value else default


class Traffic:
    """Short requests in flight and the long jobs beside them (see the module docstring)."""

    def __init__(
        self,
        base_threads: int | None = None,
        long_threads: int | None = None,
        busy_share: float = 1 / 3,
    ):
        cores = os.cpu_count() or 1
        self.base_threads = base_threads or env_threads("TXL_TORCH_THREADS", 1)
        self.long_threads = long_threads or min(env_threads("TXL_LONG_THREADS", 2), cores)
        self.busy_share = busy_share
        self._lock = threading.Condition()
        self._short = 0  # short requests in flight
        self._spread = 0  # long-job chunks running with more than base_threads
        self._jobs: weakref.WeakValueDictionary[object, LongJob] = weakref.WeakValueDictionary()
        self._rate: dict[int, float] = {}  # seconds per unit of work, by thread count
        self._free_chunks = 0  # chunks started while the cores were free
        self._interval = PROBE_EVERY  # chunks between tries of the thread count not chosen
        self._next_probe = 0
        self.pausing = 0  # long jobs pausing for short requests now
        self.waited_s = 0.0  # total time long jobs waited for short ones (for benchmarks)

    # -- short requests --

    @contextmanager
    def short(self):
        """A short request: long jobs work less while it runs. Pins this thread's torch
        threads to base_threads."""
        with self._lock:
            self._short += 1
        try:
            if torch.get_num_threads() != self.base_threads:
                torch.set_num_threads(self.base_threads)
            yield
        finally:
            with self._lock:
                self._short -= 1
                if self._short == 0:
                    self._lock.notify_all()

    @property
    def busy(self) -> bool:
        """Whether a short request is in flight now."""
        return self._short > 0

    # -- long jobs --

    def start_job(self, owner: object | None = None) -> LongJob:
        """A new long job; ``owner``'s previous job (if still running) is cancelled."""
        job = LongJob(self)
        if owner is not None:
            key = id(owner)
            with self._lock:
                previous = self._jobs.get(key)
                self._jobs[key] = job
            if previous is not None:
                previous.cancel()
        return job

    def cancel(self, owner: object) -> None:
        """Cancel ``owner``'s running job, if any (it stops at its next turn)."""
        with self._lock:
            job = self._jobs.pop(id(owner), None)
        if job is not None:
            job.cancel()

    def _threads_now(self, calibrating: bool) -> tuple[int, bool]:
        """(threads for the next chunk, whether the cores are free for it). Under the lock.

        Chunks alike (``calibrating``) measure one thread first, then two, then keep the
        faster, trying the other now and then: a try that confirms the choice doubles the
        interval to the next (PROBE_EVERY chunks, up to 8 times that), one that overturns
        it starts again from PROBE_EVERY. Other chunks take the choice, one thread before
        any is made."""
        if not self._cores_free():
            return self.base_threads, False
        self._free_chunks += 1
        single, spread = self._rate.get(self.base_threads), self._rate.get(self.long_threads)
        if single is None or spread is None:
            first = self.base_threads if single is None else self.long_threads
            return (first if calibrating else self.base_threads), True
        if calibrating and self._free_chunks >= self._next_probe:
            return self._other(self._best()), True
        return self._best(), True

    def _cores_free(self) -> bool:
        """No short request in flight, no other long chunk spread out, cores to spread
        on. Under the lock."""
        return not self._short and not self._spread and self.long_threads > 1

    def _best(self) -> int:
        single, spread = self._rate[self.base_threads], self._rate[self.long_threads]
        return self.long_threads if spread < 0.9 * single else self.base_threads

    def _other(self, threads: int) -> int:
        return self.base_threads if threads == self.long_threads else self.long_threads

    def _record(self, threads: int, rate: float) -> None:
        """A calibrating chunk's seconds per unit of work. Under the lock."""
        known = len(self._rate) == 2
        before = self._best() if known else None
        old = self._rate.get(threads)
        self._rate[threads] = rate if old is None else 0.5 * old + 0.5 * rate
        if before is not None and threads != before:  # that was a try of the other
            confirmed = self._best() == before
            self._interval = min(2 * self._interval, 8 * PROBE_EVERY) if confirmed else PROBE_EVERY
        if len(self._rate) == 2 and (before is None or threads != before):
            self._next_probe = self._free_chunks + self._interval

    @contextmanager
    def turn(self, job: LongJob, work: float | None = None, tasks: int = 1):
        """One chunk of a long job: its threads now, its pause afterwards. ``work``: the
        chunk's size when chunks are alike (the sliding window's windows): their speed
        with each thread count, measured while the cores are free, decides whether
        spreading pays (it does not when other processes hold the cores).

        Yields the chunk's torch threads; with ``tasks`` > 1 (a chunk of that many
        independent tasks) how many of them to run at once instead (txl.threads.side_by_side):
        up to long_threads when the cores are free, else one."""
        if job.cancelled:
            raise JobCancelled
        with self._lock:
            if tasks > 1:
                free = self._cores_free()
                threads = min(tasks, self.long_threads) if free else 1
            else:
                threads, free = self._threads_now(calibrating=bool(work))
            spread = threads > self.base_threads
            if spread:
                self._spread += 1
        t0 = time.perf_counter()
        try:
            torch_count = self.base_threads if tasks > 1 else threads
            with torch_threads(torch_count, restore=self.base_threads):
                yield threads
        finally:
            if spread:
                with self._lock:
                    self._spread -= 1
        took = time.perf_counter() - t0
        if work and free and not self._short:  # the cores were free all along: a fair sample
            with self._lock:
                self._record(threads, took / work)
        if self._short and self.busy_share < 1:
            pause = took * (1 - self.busy_share) / self.busy_share
            t1 = time.perf_counter()
            with self._lock:
                self.pausing += 1
                self._lock.notify_all()  # for whoever waits to see a job pause (tests)
                try:
                    self._lock.wait_for(lambda: not self._short or job.cancelled, timeout=pause)
                finally:
                    self.pausing -= 1
            self.waited_s += time.perf_counter() - t1
        if job.cancelled:
            raise JobCancelled


class LongJob:
    """One long request's handle: ``turn()`` around each chunk, ``cancel()``, ``close()``."""

    def __init__(self, traffic: Traffic):
        self.traffic = traffic
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
        with self.traffic._lock:  # wake it if it is pausing for short requests
            self.traffic._lock.notify_all()

    def close(self) -> None:
        """The job is over (finished, failed or abandoned): nothing more may run."""
        self._cancelled.set()

    def turn(self, work: float | None = None, tasks: int = 1):
        return self.traffic.turn(self, work, tasks)
