"""Torch threads: independent pieces of work side by side, one core each.

torch's intra-op thread count is set per OS thread (``torch.set_num_threads``), and a new
thread starts with the count last set anywhere. Tasks that share nothing (the same text
read with two memory lengths) can each take one core and one torch thread: they never wait
on each other, as the threads of one product do. The caller decides how many run at once
(``txl.scoring.score_stages``' ``pace``: in the app, the server's scheduler, which knows how
many cores its visitors leave free).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager

import torch

# Most tasks side by side at once, over every caller: two Scores at a time each with two
# cores' tasks fit, and more only wait their turn (a task never waits on the pool).
MAX_SIDE_TASKS = 16
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _alone(task):
    """``task`` with one torch thread on this pool thread: set for each task, since a pool
    thread keeps whatever count its last task left (and starts with the last set anywhere)."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    return task()


def _side_pool() -> ThreadPoolExecutor:
    """The threads that run side_by_side's other tasks, one pool for the process: a pool
    made and joined per call cost ~2 ms a call, 0.14 s of a Score's 62 chunks (12-06)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_SIDE_TASKS, thread_name_prefix="txl-task")
        return _pool


def side_by_side(tasks, at_once: int) -> list:
    """Run the functions ``tasks`` (no arguments) ``at_once`` at a time, each with one
    torch thread on its own OS thread (the first of each group in this one); their
    results in order. An exception in any is raised here after the group ends."""
    tasks, results = list(tasks), []
    if at_once <= 1 or len(tasks) <= 1:
        return [task() for task in tasks]
    pool = _side_pool()
    for i in range(0, len(tasks), at_once):
        group = tasks[i : i + at_once]
        others = [pool.submit(_alone, task) for task in group[1:]]
        try:
            with torch_threads(1, restore=torch.get_num_threads()):
                first = group[0]()
        finally:  # the group ends together, even when its first task fails
            wait(others)
        results += [first] + [other.result() for other in others]
    return results


@contextmanager
def torch_threads(n: int, restore: int):
    """Run the block with ``n`` torch threads on this OS thread, then set ``restore``."""
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != restore:
            torch.set_num_threads(restore)
