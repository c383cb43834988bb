"""txl/threads.py: independent tasks side by side, one torch thread each."""

from __future__ import annotations

import threading

import pytest
import torch

from txl.threads import MAX_SIDE_TASKS, side_by_side


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


def test_side_by_side_keeps_one_pool_of_threads_and_ends_each_group_together():
    """Calls share one pool of threads (a pool made per call cost ~2 ms a chunk of a
    Score): over many calls the other tasks run on at most MAX_SIDE_TASKS threads. When a
    group's first task fails, the error reaches the caller only after the group's other
    tasks have finished, as it did when each call joined its own pool."""
    threads = {
        id(t): t
        for t in (  # the Thread objects kept: their ids are not reused
            side_by_side([threading.current_thread] * 2, at_once=2)[1]
            for _ in range(3 * MAX_SIDE_TASKS)
        )
    }
    assert 1 <= len(threads) <= MAX_SIDE_TASKS
    assert all(t is not threading.current_thread() for t in threads.values())

    started, go_on, finished = threading.Event(), threading.Event(), threading.Event()

    def fails_once_the_other_runs():
        started.wait(timeout=300)
        go_on.set()
        raise ValueError("boom")

    def the_other():
        started.set()
        go_on.wait(timeout=300)
        finished.set()

    with pytest.raises(ValueError, match="boom"):
        side_by_side([fails_once_the_other_runs, the_other], at_once=2)
    assert finished.is_set()


def test_a_task_that_leaves_other_torch_threads_does_not_pass_them_on():
    """Each task beside the first runs with one torch thread, whatever count an earlier
    task left on the pool thread it reuses."""

    def leaves_two():
        torch.set_num_threads(2)

    for _ in range(3 * MAX_SIDE_TASKS):  # the pool's threads are reused: each met again
        side_by_side([lambda: None, leaves_two], at_once=2)
        assert side_by_side([lambda: None, torch.get_num_threads], at_once=2)[1] == 1
