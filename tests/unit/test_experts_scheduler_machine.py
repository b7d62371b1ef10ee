"""Random sequences of submit / next_job / finished / step_inline / cancel / pause / add / remove,
then close, against the runtime's scheduling core, checked step by step against a plain model: no
request lost or run twice, an owed step always before anything else runs, one job at a time,
batches as the rules say, inline exactly when the rule says, queue bounds held."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from volunteer.errors import ExpertConfigError, ExpertPausedError, ExpertUnavailableError, UnknownExpertError
from volunteer.experts import ExpertsConfig
from volunteer.experts.requests import BATCH_KINDS, Kind, Request
from volunteer.experts.scheduler import COSTS_REMEMBERED, QUEUED, Busy, Inline, Job, Scheduler

UIDS = ("e.0", "e.1", "e.2")
CONFIG = ExpertsConfig(
    inline_compute_limit=0.001, batch_window=0.002, min_batch_size=2, max_batch_size=6, max_queue=3,
    max_queue_bytes=200,
)


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = Scheduler(UIDS[:2], CONFIG)
        self.hosted = list(UIDS[:2])
        self.now = 0.0
        self.queues: dict[tuple[str, Kind], list[Request]] = defaultdict(list)  # accepted, waiting
        self.jobs: list[Request] = []
        self.handed: set[Request] = set()  # given to a runner: ran (or runs) exactly once
        self.ended: set[Request] = set()  # stranded or cancelled
        self.owed: list[str] = []
        self.costs: dict[tuple[str, Kind], list[tuple[float, int]]] = {}  # the last runs, newest last
        self.running: Job | None = None
        self.paused = False
        self.closed = False

    # --- the model's view -------------------------------------------------------------------------
    def waiting(self) -> list[Request]:
        return [r for queue in self.queues.values() for r in queue] + self.jobs

    def ready(self, queue: list[Request]) -> bool:
        samples = sum(r.batch for r in queue)
        due = bool(queue) and self.now >= queue[0].submitted + CONFIG.batch_window
        return bool(queue) and (samples >= CONFIG.min_batch_size or due)

    def estimate(self, key: tuple[str, Kind], samples: int = 1) -> float | None:
        """The cheapest of the key's remembered runs, scaled up to ``samples``."""
        runs = self.costs.get(key, [])[-COSTS_REMEMBERED:]
        return min((seconds * max(1.0, samples / max(n, 1)) for seconds, n in runs), default=None)

    def inline_expected(self, request: Request) -> bool:
        if not request.uid or self.running is not None or self.waiting() or self.owed:
            return False
        if request.kind not in BATCH_KINDS:
            seconds = self.estimate((request.uid, request.kind))
            return seconds is not None and seconds <= CONFIG.inline_compute_limit
        seconds = self.estimate((request.uid, request.kind), request.batch)
        return request.batch >= CONFIG.min_batch_size and seconds is not None and seconds <= CONFIG.inline_compute_limit

    def hand_out(self, job: Job) -> None:
        assert self.running is None, "two jobs at once"
        self.running = job
        if job.kind is Kind.STEP:
            assert self.owed and job.uid == self.owed[0], "a step nobody owes, or out of order"
            self.owed.pop(0)
            return
        assert not self.owed, f"{job.kind.value} handed out while a step is owed"
        for request in job.requests:
            assert request not in self.handed and request not in self.ended, "run twice, or run after it ended"
            self.handed.add(request)

    # --- rules ------------------------------------------------------------------------------------------
    @initialize()
    def learn_costs(self) -> None:
        """Start with the first expert's costs learnt (forward, backward, its step, an average), so
        that the inline paths and owed steps are a few rules away; the other experts start unknown."""
        for kind in (Kind.FORWARD, Kind.BACKWARD, Kind.AVERAGE):
            self.submit("e.0", kind, 2, 2)
            self.next_job()
            self.finish(0.0002, step_owed=True)  # a backward hands its step on to the worker
            if self.running is not None:
                self.finish(0.0001, step_owed=False)

    @rule(dt=st.sampled_from([0.0, 0.0005, 0.001, 0.003]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(
        uid=st.sampled_from(UIDS + ("",)),
        kind=st.sampled_from([Kind.FORWARD, Kind.BACKWARD, Kind.JOB, Kind.AVERAGE]),
        batch=st.integers(1, 4),
        width=st.sampled_from([2, 3]),
    )
    def submit(self, uid: str, kind: Kind, batch: int, width: int) -> None:
        if kind in BATCH_KINDS:
            grads = [torch.zeros(batch, width)] if kind is Kind.BACKWARD else None
            request = Request(uid, kind, [torch.zeros(batch, width)], grads, batch=batch)
        else:
            request = Request(uid, kind, work=lambda: None)
        try:
            decision = self.core.submit(request, self.now)
        except ExpertUnavailableError as exc:
            if self.closed:
                assert type(exc) is ExpertUnavailableError
            elif kind in BATCH_KINDS and self.paused:
                assert isinstance(exc, ExpertPausedError)
            else:
                assert isinstance(exc, UnknownExpertError) and uid not in self.hosted and (uid or kind in BATCH_KINDS)
            return
        assert not self.closed and not (kind in BATCH_KINDS and self.paused)
        assert uid in self.hosted or (not uid and kind not in BATCH_KINDS)
        if kind in BATCH_KINDS:
            queued_bytes = sum(r.nbytes for q in self.queues.values() for r in q)
            full = (
                len(self.queues[uid, kind]) >= CONFIG.max_queue
                or queued_bytes + request.nbytes > CONFIG.max_queue_bytes
            )
        else:
            full = len(self.jobs) >= CONFIG.max_queue
        assert isinstance(decision, Busy) == full
        if full:
            return
        expected = self.inline_expected(request)
        assert isinstance(decision, Inline) == expected
        if expected:
            assert decision.job.inline and decision.job.requests == [request]
            self.hand_out(decision.job)
        else:
            assert decision is QUEUED
            (self.queues[uid, kind] if kind in BATCH_KINDS else self.jobs).append(request)

    @rule(kind=st.sampled_from([Kind.FORWARD, Kind.BACKWARD]), batch=st.integers(2, 4))
    def submit_to_the_known_expert(self, kind: Kind, batch: int) -> None:
        """A request the inline rule may take (its expert's costs are learnt at the start): inline
        runs and the steps they owe come often."""
        self.submit("e.0", kind, batch, 2)

    @precondition(lambda self: self.running is None and not self.waiting() and not self.owed and not self.paused)
    @rule(batch=st.integers(2, 4), seconds=st.sampled_from([0.0002, 0.002]))
    def one_trainers_backward(self, batch: int, seconds: float) -> None:
        """The one-trainer path: a backward on the idle runtime runs inline (when its cost is known
        and cheap) and leaves its step owed."""
        self.submit("e.0", Kind.BACKWARD, batch, 2)
        if self.running is not None and self.running.inline:
            self.finish(seconds, step_owed=True)

    @rule()
    def next_job(self) -> None:
        job = self.core.next_job(self.now)
        if self.running is not None:
            assert job is None
            return
        if self.owed:
            assert job is not None and job.kind is Kind.STEP
        elif self.jobs:
            assert job is not None and job.requests == [self.jobs.pop(0)]
        elif job is None:
            assert not any(self.ready(queue) for queue in self.queues.values())
        else:
            queue = self.queues[job.uid, job.kind]
            ready = [q for q in self.queues.values() if self.ready(q)]
            assert self.ready(queue) and queue[0].submitted == min(q[0].submitted for q in ready)
            expected, samples = [], 0
            for request in queue:
                if request.key == queue[0].key and samples + request.batch <= CONFIG.max_batch_size:
                    expected.append(request)
                    samples += request.batch
            assert job.requests == expected and not job.inline
            self.queues[job.uid, job.kind] = [r for r in queue if r not in expected]
        if job is not None:
            self.hand_out(job)

    @precondition(lambda self: self.running is not None)
    @rule(seconds=st.none() | st.sampled_from([0.0, 0.0002, 0.0009, 0.002]), step_owed=st.booleans())
    def finish(self, seconds: float | None, step_owed: bool) -> None:
        job, self.running = self.running, None
        follow = self.core.finished(job, seconds, step_owed=step_owed)
        hosted = job.uid in self.hosted
        if hosted and seconds is not None:
            samples = sum(r.batch for r in job.requests) if job.kind in BATCH_KINDS else 1
            self.costs.setdefault((job.uid, job.kind), []).append((seconds, samples))
        if hosted and step_owed and job.kind is Kind.BACKWARD:
            if job.inline:
                assert follow is None
                self.owed.append(job.uid)
            else:  # the worker applies its batch's step at once, before anything else
                assert follow is not None and follow.kind is Kind.STEP and follow.uid == job.uid
                self.running = follow
        else:
            assert follow is None

    @rule(seconds=st.none() | st.sampled_from([0.0, 0.0002, 0.0009, 0.002]), step_owed=st.booleans())
    def work(self, seconds: float | None, step_owed: bool) -> None:
        """The worker's whole turn (``next_job`` then ``finished``): keeps the queues moving, so that
        idle states, inline runs and owed steps are reached often. With nothing ready, it sleeps
        as long as ``wait`` says, and then a batch is ready."""
        if self.running is None:
            self.next_job()
        if self.running is None:
            wait = self.core.wait(self.now)
            if wait is not None:
                self.now += wait
                self.next_job()
                assert self.running is not None, "wait() woke the worker for nothing"
        if self.running is not None:
            self.finish(seconds, step_owed)

    @rule()
    def step_inline(self) -> None:
        job = self.core.step_inline()
        seconds = self.estimate((self.owed[0], Kind.STEP)) if self.owed else None
        expected = self.running is None and seconds is not None and seconds <= CONFIG.inline_compute_limit
        assert (job is not None) == expected
        if job is not None:
            assert job.inline
            self.hand_out(job)

    @rule(data=st.data())
    def cancel(self, data) -> None:
        candidates = self.waiting() + sorted(self.handed, key=id)
        if not candidates:
            return
        request = data.draw(st.sampled_from(candidates))
        removed = self.core.cancel(request)
        assert removed == (request in self.waiting())
        if removed:
            if request in self.jobs:
                self.jobs.remove(request)
            else:
                self.queues[request.uid, request.kind].remove(request)
            self.ended.add(request)

    @rule()
    def pause(self) -> None:
        self.core.pause()
        self.paused = True

    @rule()
    def resume(self) -> None:
        self.core.resume()
        self.paused = False

    @rule(uid=st.sampled_from(UIDS))
    def add(self, uid: str) -> None:
        try:
            self.core.add(uid)
        except ExpertConfigError:
            assert uid in self.hosted
            return
        assert uid not in self.hosted
        self.hosted.append(uid)

    @rule(uid=st.sampled_from(UIDS))
    def remove(self, uid: str) -> None:
        try:
            stranded = self.core.remove(uid)
        except UnknownExpertError:
            assert uid not in self.hosted
            return
        self.hosted.remove(uid)
        mine = [r for r in self.waiting() if r.uid == uid]
        assert sorted(stranded, key=id) == sorted(mine, key=id)
        for kind in BATCH_KINDS:
            self.queues.pop((uid, kind), None)
        self.jobs = [r for r in self.jobs if r.uid != uid]
        self.ended.update(stranded)
        self.owed = [u for u in self.owed if u != uid]
        self.costs = {key: cost for key, cost in self.costs.items() if key[0] != uid}

    # --- invariants ------------------------------------------------------------------------------------
    @invariant()
    def the_core_agrees_with_the_model(self) -> None:
        assert self.core.running is self.running
        assert self.core.owed == self.owed
        assert self.core.jobs == len(self.jobs)
        for uid in self.hosted:
            assert self.core.queued(uid) == sum(len(self.queues[uid, kind]) for kind in BATCH_KINDS)
        assert self.core.queued_bytes == sum(r.nbytes for q in self.queues.values() for r in q)

    @invariant()
    def an_owed_step_is_alone_and_nothing_runs_beside_it(self) -> None:
        assert len(self.owed) <= 1 and not (self.owed and self.running is not None)

    @invariant()
    def bounds_hold(self) -> None:
        assert all(len(queue) <= CONFIG.max_queue for queue in self.queues.values())
        assert len(self.jobs) <= CONFIG.max_queue
        assert self.core.queued_bytes <= CONFIG.max_queue_bytes

    @invariant()
    def every_request_is_in_one_place(self) -> None:
        waiting = self.waiting()
        assert len(set(map(id, waiting))) == len(waiting)
        assert not (set(waiting) & self.handed) and not (set(waiting) & self.ended) and not (self.handed & self.ended)

    def teardown(self) -> None:
        """Close: every request still waiting is handed back, then the owed steps and the job
        under way end, and nothing accepted was lost or ran twice."""
        stranded = self.core.close()
        assert sorted(stranded, key=id) == sorted(self.waiting(), key=id)
        self.ended.update(stranded)
        self.queues.clear()
        self.jobs.clear()
        self.closed = True
        self.submit("", Kind.JOB, 1, 2)  # refused now
        while not self.core.exhausted:
            if self.running is None:
                self.next_job()
            self.finish(None, False)
        assert self.running is None and not self.owed and self.core.next_job(self.now + 1.0) is None
        accepted = self.handed | self.ended
        assert len(accepted) == len(self.handed) + len(self.ended)


SchedulerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
# ~3 s of CPU: enough examples that dropping any one ordering or inline condition fails it
test_scheduler_state_machine = pytest.mark.slow(SchedulerMachine.TestCase)
