"""txl/threads.py: independent tasks side by side, one torch thread each."""

from __future__ import annotations

import threading

import pytest
import torch

from txl.threads import side_by_side


def test_side_by_side_runs_each_task_on_its_own_thread_and_keeps_the_order():
    """Results in the order of the tasks, each task on one torch thread, the first of a
    group in the caller's thread and the others beside it; an exception reaches the
    caller; the caller's torch threads are as they were."""
    torch.set_num_threads(1)
    both_running = threading.Barrier(2, timeout=300)  # passes only if two run at once

    def task(i):
        def run():
            both_running.wait()
            return i, threading.get_ident(), torch.get_num_threads()

        return run

    results = side_by_side([task(i) for i in range(4)], at_once=2)
    assert [i for i, _, _ in results] == [0, 1, 2, 3]
    assert all(threads == 1 for _, _, threads in results)
    me = threading.get_ident()
    assert results[0][1] == me and results[2][1] == me and results[1][1] != me
    assert [f() for f in [lambda: 5]] == side_by_side([lambda: 5], at_once=2)

    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        side_by_side([lambda: 1, fails], at_once=2)
    assert torch.get_num_threads() == 1
