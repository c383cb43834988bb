"""webapp/longwork.py: the threads a long job's chunk gets, its pauses for short requests,
and its cancellation. Every wait is on an event, never on a clock."""

from __future__ import annotations

import threading

import pytest
import torch

from webapp import longwork
from webapp.longwork import JobCancelled, Traffic


class FakeClock:
    """webapp.longwork's clock, advanced by the test: a chunk "takes" exactly the time the
    test says, however busy the machine (a real sleep of 1 ms can last 20 ms there)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(longwork, "time", fake)
    return fake


def calibrated(traffic: Traffic, faster: int, clock: FakeClock) -> Traffic:
    """Two chunks alike (one thread, then two) where ``faster`` threads take less time."""
    job = traffic.start_job()
    for expected in (1, 2):
        with job.turn(work=1) as threads:
            assert threads == expected
            clock.advance(0.001 if threads == faster else 0.02)
    return traffic


def test_a_chunk_spreads_only_when_no_short_request_runs(clock):
    traffic = calibrated(Traffic(base_threads=1, long_threads=2), faster=2, clock=clock)
    job = traffic.start_job()
    with job.turn() as threads:
        assert threads == 2 and torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1  # the thread is handed back as it was
    # A cancelled job ends at its turn.
    with traffic.short(), pytest.raises(JobCancelled), job.turn() as threads:
        assert threads == 1 and torch.get_num_threads() == 1
        job.cancel()
    assert torch.get_num_threads() == 1


def test_only_one_long_job_spreads_at_a_time(clock):
    traffic = calibrated(Traffic(base_threads=1, long_threads=2), faster=2, clock=clock)
    first, second = traffic.start_job(), traffic.start_job()
    with first.turn() as a, second.turn() as b:
        assert (a, b) == (2, 1)
    assert torch.get_num_threads() == 1


def test_a_short_request_pins_its_thread_to_the_base_threads():
    traffic = Traffic(base_threads=1, long_threads=2)
    torch.set_num_threads(2)  # as a thread that served a long job's chunk might be left
    try:
        with traffic.short():
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(1)


def pause_behind_a_short_request(traffic, job, log):
    """Run one turn of ``job`` in a thread while a short request runs; returns the thread
    once the job pauses behind it (log gets "resumed" or "cancelled" when it goes on)."""

    def long_work():
        try:
            with job.turn():
                log.append("chunk")
            log.append("resumed")
        except JobCancelled:
            log.append("cancelled")

    worker = threading.Thread(target=long_work)
    worker.start()
    with traffic._lock:
        assert traffic._lock.wait_for(lambda: traffic.pausing == 1, timeout=300)
    return worker


def test_a_long_job_waits_for_short_requests_to_end():
    # A share of ~0: the pause after any chunk outlasts the test unless the short ends.
    traffic = Traffic(base_threads=1, long_threads=2, busy_share=1e-9)
    job, log = traffic.start_job(), []
    with traffic.short():
        worker = pause_behind_a_short_request(traffic, job, log)
        log.append("short ends")
    worker.join(timeout=300)
    assert log == ["chunk", "short ends", "resumed"]


def test_a_new_job_of_the_same_owner_cancels_the_old_one_even_while_it_pauses():
    traffic = Traffic(base_threads=1, long_threads=2, busy_share=1e-9)
    owner = object()
    old, log = traffic.start_job(owner), []
    with traffic.short():
        worker = pause_behind_a_short_request(traffic, old, log)
        new = traffic.start_job(owner)
        worker.join(timeout=300)
        assert log == ["chunk", "cancelled"] and old.cancelled and not new.cancelled
    traffic.cancel(owner)  # what the page's Score click does before a new Score
    assert new.cancelled
    with pytest.raises(JobCancelled), new.turn():
        pass  # pragma: no cover


def test_a_long_job_keeps_one_thread_while_two_do_not_pay(clock):
    """Chunks alike (work=1) where two threads are slower (other processes hold the
    cores; here the chunk just takes longer with two): one thread is measured, then two,
    then one is kept; two are tried again after PROBE_EVERY chunks, then after twice as
    many since the try confirmed the choice. Chunks without work= take the choice."""
    from webapp.longwork import PROBE_EVERY

    traffic = Traffic(base_threads=1, long_threads=2)
    job, used = traffic.start_job(), []
    with job.turn() as threads:  # nothing measured yet: one thread
        assert threads == 1
    for _ in range(3 * PROBE_EVERY):
        with job.turn(work=1) as threads:
            used.append(threads)
            clock.advance(0.02 if threads == 2 else 0.001)  # the chunk's work, slower spread
    assert used[:2] == [1, 2]
    first_try = 2 + PROBE_EVERY - 1  # counted in chunks on free cores (the first included)
    assert used[2:first_try] == [1] * (first_try - 2) and used[first_try] == 2
    assert used[first_try + 1 :] == [1] * (len(used) - first_try - 1)  # next: 2x later
    with job.turn() as threads:
        assert threads == 1


def test_independent_tasks_run_side_by_side_only_on_free_cores(clock):
    """turn(tasks=n): as many at once as the free cores allow, without any measuring
    (separate tasks cannot slow each other down as two threads of one product can), one
    when a short request runs; the caller's own thread keeps one torch thread."""
    traffic = Traffic(base_threads=1, long_threads=2)
    job = traffic.start_job()
    with job.turn(tasks=3) as at_once:
        assert at_once == 2 and torch.get_num_threads() == 1
        with traffic.start_job().turn(tasks=2) as other:  # the extra core is taken
            assert other == 1
    with job.turn(tasks=1) as threads:  # one task is a plain chunk: not measured yet
        assert threads == 1
    with traffic.short(), job.turn(tasks=2) as at_once:
        assert at_once == 1
