"""The runtime's scheduling core, without threads, trio or a clock: what runs next (owed steps,
then jobs, then batches), which request runs inline, the costs it learns, the queue bounds, pause,
experts coming and going, closing, and the order that keeps the shortcut race out."""

from __future__ import annotations

import pytest
import torch

from volunteer.errors import (
    ExpertConfigError,
    ExpertPausedError,
    ExpertUnavailableError,
    LocalProtocolError,
    UnknownExpertError,
)
from volunteer.experts import ExpertsConfig
from volunteer.experts.requests import Kind, Request
from volunteer.experts.scheduler import COSTS_REMEMBERED, QUEUED, Busy, Cost, CostKey, Inline, Job, Scheduler

LIMIT = 0.001
CONFIG = ExpertsConfig(inline_compute_limit=LIMIT, batch_window=0.002, max_queue=3, max_batch_size=8)


def forward(uid="e.0", batch=1, width=4) -> Request:
    return Request(uid, Kind.FORWARD, [torch.zeros(batch, width)], batch=batch)


def backward(uid="e.0", batch=1, settle_later=False) -> Request:
    grads = [torch.zeros(batch, 4)]
    return Request(uid, Kind.BACKWARD, [torch.zeros(batch, 4)], grads, batch=batch, settle_later=settle_later)


def job(uid="", kind=Kind.JOB) -> Request:
    return Request(uid, kind, work=lambda: None)


def core(uids=("e.0", "e.1"), config=CONFIG) -> Scheduler:
    return Scheduler(uids, config)


def teach(sched: Scheduler, uid="e.0", kind=Kind.FORWARD, seconds=0.0002, samples=1) -> None:
    """Give the core a learnt cost, as a finished worker batch would."""
    grads = [torch.zeros(samples, 4)] if kind is Kind.BACKWARD else None
    request = Request(uid, kind, [torch.zeros(samples, 4)], grads, batch=samples)
    assert sched.submit(request, 0.0) is QUEUED
    taken = sched.next_job(1.0)
    assert taken.requests == [request]
    assert sched.finished(taken, seconds) is None
    assert sched.cost(CostKey(uid, kind)) == Cost(seconds, samples)


# --- order -------------------------------------------------------------------------------------


def test_a_batch_then_its_owed_step_then_jobs_then_batches():
    sched = core()
    first = backward()
    sched.submit(first, 0.0)
    taken = sched.next_job(0.0)
    assert taken.kind is Kind.BACKWARD and taken.requests == [first] and not taken.inline
    later_forward, later_job = forward(), job()
    assert sched.submit(later_forward, 0.0) is QUEUED and sched.submit(later_job, 0.0) is QUEUED
    follow = sched.finished(taken, 0.001, step_owed=True)
    # the worker applies the batch's step before it lets go: nothing runs in between
    assert follow.kind is Kind.STEP and follow.uid == "e.0" and sched.running is follow
    assert sched.next_job(1.0) is None
    assert sched.finished(follow, 0.0001) is None
    assert sched.next_job(1.0).requests == [later_job]  # jobs come before batches
    sched.finished(sched.running, None)
    assert sched.next_job(1.0).requests == [later_forward]


def test_nothing_runs_beside_a_running_job():
    sched = core()
    sched.submit(forward(), 0.0)
    running = sched.next_job(0.0)
    sched.submit(forward("e.1"), 0.0)
    assert sched.next_job(1.0) is None and sched.wait(1.0) is None  # woken when it finishes
    sched.finished(running, None)
    assert sched.next_job(1.0).uid == "e.1"


def test_the_oldest_ready_queue_goes_first_with_its_compatible_requests_up_to_the_batch_bound():
    sched = core(config=ExpertsConfig(min_batch_size=1, max_batch_size=8, max_queue=10))
    a = forward("e.1", batch=2)
    b = forward("e.0", batch=3)
    c = forward("e.1", batch=5, width=6)  # other sizes: another batch
    d = forward("e.1", batch=4)
    e = forward("e.1", batch=3)  # would exceed 8 samples with a and d
    for t, request in enumerate((a, b, c, d, e)):
        sched.submit(request, float(t))
    assert sched.next_job(10.0).requests == [a, d]  # e.1's head is the oldest
    sched.finished(sched.running, None)
    assert sched.next_job(10.0).requests == [b]
    sched.finished(sched.running, None)
    assert sched.next_job(10.0).requests == [c]
    sched.finished(sched.running, None)
    assert sched.next_job(10.0).requests == [e]


def test_a_queue_short_of_min_batch_size_waits_out_its_window():
    sched = core(config=ExpertsConfig(min_batch_size=4, batch_window=0.2, max_batch_size=8))
    first = forward(batch=1)
    sched.submit(first, 10.0)
    assert sched.next_job(10.05) is None
    assert sched.wait(10.05) == pytest.approx(0.15)
    sched.submit(forward(batch=3), 10.1)  # four samples now: ready at once
    assert len(sched.next_job(10.1).requests) == 2
    sched.finished(sched.running, None)
    sched.submit(forward(batch=1), 11.0)
    assert sched.next_job(11.1) is None
    assert len(sched.next_job(11.2).requests) == 1  # the window is over
    assert sched.wait(12.0) is None  # running, and nothing else queued


# --- inline --------------------------------------------------------------------------------------


def test_a_cheap_lone_request_on_an_idle_runtime_runs_inline():
    sched = core()
    assert sched.submit(forward(), 0.0) is QUEUED  # its cost is not known yet
    sched.finished(sched.next_job(1.0), 0.0004)
    decision = sched.submit(forward(batch=2), 2.0)  # twice the samples: 0.8 ms
    assert isinstance(decision, Inline) and decision.job.inline and sched.running is decision.job
    assert sched.next_job(3.0) is None  # the worker stays out while it runs
    sched.finished(decision.job, 0.0004)
    assert sched.cost(CostKey("e.0", Kind.FORWARD)) == Cost(0.0004, 2)
    assert sched.submit(forward(batch=6), 4.0) is QUEUED  # 1.2 ms by the last cost: too dear


def test_no_inline_while_anything_else_runs_waits_or_is_owed():
    sched = core()
    teach(sched, "e.0", Kind.FORWARD)
    teach(sched, "e.0", Kind.BACKWARD)
    sched.submit(job(), 0.0)  # a job waits
    assert sched.submit(forward(), 0.0) is QUEUED
    sched.finished(sched.next_job(0.0), None)
    sched.finished(sched.next_job(1.0), None)  # the forward
    sched.submit(forward("e.1"), 2.0)  # another expert's request waits
    assert sched.submit(forward(), 2.0) is QUEUED
    sched.finished(sched.next_job(3.0), None)
    sched.finished(sched.next_job(3.0), None)
    decision = sched.submit(backward(settle_later=True), 4.0)  # inline: its step is owed ...
    assert isinstance(decision, Inline)
    assert sched.finished(decision.job, 0.0002, step_owed=True) is None
    assert sched.owed == ["e.0"]
    assert sched.submit(forward(), 4.0) is QUEUED  # ... and nothing overtakes it
    assert sched.next_job(4.0).kind is Kind.STEP


def test_inline_is_off_with_a_zero_limit_and_for_jobs_on_no_expert():
    sched = core(config=ExpertsConfig(inline_compute_limit=0))
    teach(sched, "e.0", Kind.FORWARD, seconds=0.0)
    assert sched.submit(forward(), 2.0) is QUEUED
    sched = core()
    for _ in range(2):
        assert sched.submit(job(), 0.0) is QUEUED  # run_sync: always the worker's
        sched.finished(sched.next_job(0.0), 0.0)


def test_a_job_on_an_expert_runs_inline_under_the_same_cost_rule():
    sched = core()
    assert sched.submit(job("e.0", Kind.AVERAGE), 0.0) is QUEUED
    sched.finished(sched.next_job(0.0), 0.0003)
    assert sched.cost(CostKey("e.0", Kind.AVERAGE)) == Cost(0.0003, 1)
    for _ in range(COSTS_REMEMBERED):
        decision = sched.submit(job("e.0", Kind.AVERAGE), 1.0)
        assert isinstance(decision, Inline)
        sched.finished(decision.job, 0.005)  # it grew dear: once every remembered run was, ...
    assert sched.submit(job("e.0", Kind.AVERAGE), 2.0) is QUEUED  # ... the next goes to the worker


def test_min_batch_size_keeps_a_small_request_off_the_inline_path():
    sched = core(config=ExpertsConfig(min_batch_size=2, inline_compute_limit=LIMIT))
    teach(sched, "e.0", Kind.FORWARD, samples=2)
    assert sched.submit(forward(batch=1), 2.0) is QUEUED
    sched.finished(sched.next_job(3.0), None)
    assert isinstance(sched.submit(forward(batch=2), 4.0), Inline)


def test_an_owed_step_runs_inline_only_when_cheap_and_idle():
    sched = core()
    teach(sched, "e.0", Kind.BACKWARD)
    decision = sched.submit(backward(settle_later=True), 1.0)
    sched.finished(decision.job, 0.0002, step_owed=True)
    assert sched.step_inline() is None  # its cost is unknown: the worker's
    step = sched.next_job(1.0)
    sched.finished(step, 0.0001)
    assert sched.cost(CostKey("e.0", Kind.STEP)) == Cost(0.0001, 1)
    decision = sched.submit(backward(settle_later=True), 2.0)
    sched.finished(decision.job, 0.0002, step_owed=True)
    step = sched.step_inline()
    assert step.kind is Kind.STEP and step.inline and sched.owed == []
    assert sched.step_inline() is None and sched.next_job(2.0) is None
    sched.finished(step, 0.01)  # dear now: once may be a preempted run, the cheap one still counts
    for _ in range(COSTS_REMEMBERED - 1):
        decision = sched.submit(backward(settle_later=True), 3.0)
        sched.finished(decision.job, 0.0002, step_owed=True)
        step = sched.step_inline()
        assert step is not None
        sched.finished(step, 0.01)
    decision = sched.submit(backward(settle_later=True), 3.0)  # every remembered step dear: the worker's
    sched.finished(decision.job, 0.0002, step_owed=True)
    assert sched.step_inline() is None and sched.next_job(3.0).kind is Kind.STEP


def test_one_slow_run_does_not_send_the_calls_after_it_to_the_worker():
    """A busy machine preempts a cheap forward now and then: the inline rule goes by the cheapest
    of the last few runs, so the next call still runs inline (on the worker it would pay two
    thread hand-offs on that same busy machine); a cost that truly rose shows within them."""
    sched = core()
    teach(sched, "e.0", Kind.FORWARD, seconds=0.0004)
    for index in range(COSTS_REMEMBERED):  # preempted once, then the expert truly is dearer
        decision = sched.submit(forward(batch=1), 1.0 + index)
        assert isinstance(decision, Inline), index  # the cheap run is still remembered
        sched.finished(decision.job, 0.005)
        if index == 0:
            assert sched.cost(CostKey("e.0", Kind.FORWARD)) == Cost(0.005, 1)
            assert sched.estimate(CostKey("e.0", Kind.FORWARD)) == 0.0004
    assert sched.submit(forward(batch=1), 4.0) is QUEUED


def test_a_finished_job_leaves_the_runtime_idle_before_its_caller_is_woken():
    """The race a test caught once: a ``settled()`` job went idle only after it woke its caller,
    whose next cheap request then found the runtime busy and queued. The driver calls
    ``finished`` before it wakes anyone; the core is idle from then on."""
    sched = core()
    teach(sched, "e.0", Kind.FORWARD)
    sched.submit(job(), 1.0)
    settled = sched.next_job(1.0)
    early = forward()
    assert sched.submit(early, 1.0) is QUEUED  # woken before finished(), it queued behind the job
    assert sched.cancel(early)
    sched.finished(settled, 0.0)  # the driver's order: finished, then the wake-up
    assert isinstance(sched.submit(forward(), 1.0), Inline)  # the woken caller's next request


def test_a_worker_batch_that_owes_a_step_keeps_the_runtime_busy_until_the_step_is_in():
    sched = core()
    teach(sched, "e.0", Kind.FORWARD)
    sched.submit(backward(), 1.0)
    taken = sched.next_job(1.0)
    follow = sched.finished(taken, 0.0002, step_owed=True)
    # its caller is woken now; its next forward must not see the parameters without the step
    assert sched.submit(forward(), 1.0) is QUEUED
    assert sched.step_inline() is None
    sched.finished(follow, 0.0001)
    assert sched.next_job(2.0).kind is Kind.FORWARD


# --- bounds, pause, cancel --------------------------------------------------------------------------


def test_queue_bounds_answer_busy():
    sched = core()  # max_queue 3
    sched.submit(job(), 0.0)
    sched.next_job(0.0)  # the worker is held: everything queues
    for _ in range(3):
        assert sched.submit(forward(), 0.0) is QUEUED
    busy = sched.submit(forward(), 0.0)
    assert isinstance(busy, Busy) and "3 forward requests queued" in busy.reason
    assert sched.submit(backward(), 0.0) is QUEUED  # backward has a queue of its own
    for _ in range(3):
        sched.submit(job(), 0.0)
    assert sched.submit(job(), 0.0) == Busy("the runtime's call queue is full")
    small = core(config=ExpertsConfig(max_queue_bytes=100))
    small.submit(job(), 0.0)
    small.next_job(0.0)
    assert small.submit(forward(batch=2, width=8), 0.0) is QUEUED  # 64 bytes
    busy = small.submit(forward(batch=2, width=8), 0.0)
    assert isinstance(busy, Busy) and "64 bytes" in busy.reason and small.queued_bytes == 64


def test_a_cancelled_request_leaves_its_queue_and_frees_its_room():
    sched = core()
    sched.submit(job(), 0.0)
    sched.next_job(0.0)
    requests = [forward(batch=2) for _ in range(3)]
    for request in requests:
        sched.submit(request, 0.0)
    assert sched.cancel(requests[1]) and not sched.cancel(requests[1])
    assert sched.queued("e.0") == 2 and sched.queued_bytes == 2 * 32
    assert sched.submit(forward(), 0.0) is QUEUED
    waiting = job()
    sched.submit(waiting, 0.0)
    assert sched.cancel(waiting) and sched.jobs == 0
    sched.finished(sched.running, None)
    taken = sched.next_job(1.0)
    assert taken.requests[:2] == [requests[0], requests[2]]
    assert not sched.cancel(requests[0])  # taken already: the driver skips it


def test_pause_refuses_new_requests_but_runs_queued_ones_and_jobs():
    sched = core()
    queued = forward()
    sched.submit(queued, 0.0)
    sched.pause()
    with pytest.raises(ExpertPausedError):
        sched.submit(forward(), 0.0)
    with pytest.raises(ExpertPausedError):
        sched.submit(backward(), 0.0)
    assert sched.submit(job(), 0.0) is QUEUED
    assert sched.next_job(0.0).kind is Kind.JOB
    sched.finished(sched.running, None)
    assert sched.next_job(1.0).requests == [queued]
    sched.finished(sched.running, None)
    sched.resume()
    assert sched.submit(forward(), 2.0) is QUEUED


# --- experts coming and going, closing ----------------------------------------------------------


def test_removing_an_expert_strands_its_requests_and_jobs_and_forgets_its_step_and_costs():
    sched = core()
    teach(sched, "e.0", Kind.BACKWARD)
    decision = sched.submit(backward(settle_later=True), 1.0)
    sched.finished(decision.job, 0.0002, step_owed=True)
    mine = [forward(), backward(), job("e.0", Kind.AVERAGE)]
    others = [forward("e.1"), job()]
    for request in mine + others:
        sched.submit(request, 1.0)
    stranded = sched.remove("e.0")
    assert set(stranded) == set(mine) and sched.owed == [] and sched.cost(CostKey("e.0", Kind.BACKWARD)) is None
    assert sched.uids == ["e.1"] and sched.queued_bytes == others[0].nbytes
    with pytest.raises(UnknownExpertError):
        sched.submit(forward(), 1.0)
    with pytest.raises(UnknownExpertError):
        sched.submit(job("e.0", Kind.AVERAGE), 1.0)
    with pytest.raises(UnknownExpertError):
        sched.remove("e.0")
    assert sched.next_job(2.0).requests == [others[1]]


def test_a_removed_experts_running_batch_finishes_and_learns_and_owes_nothing():
    sched = core()
    sched.submit(backward(), 0.0)
    taken = sched.next_job(0.0)
    sched.remove("e.0")
    assert sched.finished(taken, 0.0002, step_owed=True) is None
    assert sched.owed == [] and sched.running is None
    sched.add("e.0")  # back, from zero
    assert sched.cost(CostKey("e.0", Kind.BACKWARD)) is None and sched.queued("e.0") == 0
    with pytest.raises(ExpertConfigError):
        sched.add("e.0")


def test_closing_strands_the_queues_refuses_more_and_still_hands_out_owed_steps():
    sched = core()
    teach(sched, "e.0", Kind.BACKWARD)
    decision = sched.submit(backward(), 1.0)
    sched.finished(decision.job, 0.0002, step_owed=True)
    waiting = [forward(), job()]
    for request in waiting:
        sched.submit(request, 1.0)
    assert set(sched.close()) == set(waiting) and not sched.exhausted
    with pytest.raises(ExpertUnavailableError):
        sched.submit(job(), 1.0)
    step = sched.next_job(1.0)
    assert step.kind is Kind.STEP and not sched.exhausted
    sched.finished(step, 0.0001)
    assert sched.next_job(2.0) is None and sched.exhausted


def test_misuse_is_refused():
    sched = core()
    with pytest.raises(LocalProtocolError):
        sched.submit(Request("e.0", Kind.STEP), 0.0)
    sched.submit(forward(), 0.0)
    taken = sched.next_job(0.0)
    with pytest.raises(LocalProtocolError):
        sched.finished(Job(Kind.STEP, "e.0"), None)  # not the job that runs
    sched.finished(taken, None)
    with pytest.raises(LocalProtocolError):
        sched.finished(taken, None)  # twice
