"""The experts runtime's scheduling rules, as a synchronous core: no threads, no trio, no clock.

Everything that decides what the runtime computes, where and in which order lives here (h11's
``_state.py`` is the model); ``runtime.py`` carries the decisions out: it owns the worker thread,
the lock around this core, the trio wake-ups and the torch calls, and passes ``now`` in.

**One job at a time.** Torch runs on the runtime's worker thread, or, for a cheap request, right
on the event loop; either way ``running`` holds the one job under way, so an expert's state is
never touched from two threads at once. ``next_job`` gives the worker nothing while a job runs,
and ``finished(job, seconds)`` ends it.

**Order** (``next_job``):
1. an optimizer step a backward owes (``Kind.STEP``). A backward's step is deferred so that its
   reply leaves first; from then until the step is applied the step is *owed*, and nothing
   (no batch, no job, no inline request) runs before it, so nothing computes with or reads the
   expert's parameters without it. After a batch the worker computed, the step follows at once
   (``finished`` hands it back as the worker's next job); after an inline backward it waits for
   ``step_inline`` (the caller has sent its reply) or for the worker, whichever comes first;
2. jobs (``Kind.JOB``, ``Kind.AVERAGE``: a function run between batches), in arrival order;
3. a batch: from the ready queue whose oldest request is oldest (a queue is ready once it holds
   ``min_batch_size`` samples or its oldest request waited ``batch_window``), the requests of its
   oldest request's sizes, oldest first, up to ``max_batch_size`` samples.

**Inline** (``submit`` answers ``Inline``): a request runs on the event loop, without the two
thread hand-offs, when the worker would take it at once and alone (nothing runs, nothing is
queued or owed) and it is cheap: its last like call on that expert (its cost key: uid and kind)
took at most ``inline_compute_limit``, scaled by its samples: the cheapest of its last
``COSTS_REMEMBERED`` runs, so that one run a busy machine preempted does not send the calls after
it to the worker (two thread hand-offs each, on that same busy machine) until one of them runs
fast again. An owed step runs inline the same way (``step_inline``). A job on no expert
(``run_sync``) always goes to the worker.

**Costs** are learnt from finished jobs that ran whole (one call for the whole batch), per
``CostKey`` (expert, kind), the last ``COSTS_REMEMBERED`` of each; an expert's costs leave with it.

**Bounds** (``submit`` answers ``Busy``): ``max_queue`` requests per expert and kind,
``max_queue_bytes`` of queued inputs in all, ``max_queue`` jobs. ``pause()`` refuses new
forwards and backwards (queued ones still run; jobs still run). ``remove`` and ``close`` hand back
the requests they strand, for the driver to fail.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from ..errors import (
    ExpertConfigError,
    ExpertPausedError,
    ExpertUnavailableError,
    LocalProtocolError,
    UnknownExpertError,
)
from .config import DEFAULT_CONFIG, ExpertsConfig
from .requests import BATCH_KINDS, JOB_KINDS, Kind, Request

# Runs per cost key whose cheapest the inline rule goes by: a true rise in an expert's cost shows
# within this many runs, a preempted run's does not (each call it sent to the worker cost two
# thread hand-offs, 0.1-1 ms on a loaded machine, more than the inline run it stood for)
COSTS_REMEMBERED = 4


class CostKey(NamedTuple):
    """What a learnt cost is kept under: an expert and a kind of work on it."""

    uid: str
    kind: Kind


class Cost(NamedTuple):
    """How long a whole run of one cost key took, and for how many samples."""

    seconds: float
    samples: int


@dataclass(eq=False, slots=True)
class Job:
    """Work the scheduler handed out: a batch of one expert's forwards or backwards, an owed step,
    or one job request. ``inline``: it runs on the event loop, not on the worker."""

    kind: Kind
    uid: str  # "" for a job on no expert
    requests: list[Request] = field(default_factory=list)
    inline: bool = False

    @property
    def cost_key(self) -> CostKey:
        """The key this job's cost is learnt under."""
        return CostKey(self.uid, self.kind)


@dataclass(frozen=True)
class Inline:
    """``submit``'s answer: run ``job`` now, on the caller's thread, then call ``finished``."""

    job: Job


@dataclass(frozen=True)
class Queued:
    """``submit``'s answer: the request waits for the worker."""


@dataclass(frozen=True)
class Busy:
    """``submit``'s answer: a bound is reached; the request is refused (``reason`` says which)."""

    reason: str


QUEUED = Queued()


class _Queue:
    """One expert's queue of one kind: requests, oldest first, and their samples."""

    __slots__ = ("requests", "samples")

    def __init__(self) -> None:
        self.requests: deque[Request] = deque()
        self.samples = 0


class Scheduler:
    """The runtime's scheduling state (see the module docstring). Not thread-safe: the runtime
    calls it under its lock."""

    def __init__(self, uids: Iterable[str] = (), config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self.running: Job | None = None  # the one job under way, on the worker or inline
        self.paused = False
        self.closing = False
        self.queued_bytes = 0  # inputs of all queued requests
        self._queues: dict[tuple[str, Kind], _Queue] = {}
        self._jobs: deque[Request] = deque()
        self._owed: dict[str, None] = {}  # experts owing a step, in the order they came to owe it
        self._costs: dict[CostKey, deque[Cost]] = {}  # the last COSTS_REMEMBERED runs, newest last
        self._queued = 0  # requests in all queues
        for uid in uids:
            self.add(uid)

    # --- experts ---------------------------------------------------------------------------
    @property
    def uids(self) -> list[str]:
        """The experts scheduled, in the order they were added."""
        return [uid for uid, kind in self._queues if kind is Kind.FORWARD]

    def add(self, uid: str) -> None:
        """Schedule ``uid`` from now on."""
        if (uid, Kind.FORWARD) in self._queues:
            raise ExpertConfigError(f"this runtime already serves {uid!r}")
        for kind in (Kind.FORWARD, Kind.BACKWARD):
            self._queues[uid, kind] = _Queue()

    def remove(self, uid: str) -> list[Request]:
        """Stop scheduling ``uid``; returns its queued requests and jobs (the caller fails them).
        Its owed step goes with its backend (every backend method settles it first); a job of it
        that runs now finishes."""
        if (uid, Kind.FORWARD) not in self._queues:
            raise UnknownExpertError(f"no expert {uid!r} here")
        stranded: list[Request] = []
        for kind in (Kind.FORWARD, Kind.BACKWARD):
            queue = self._queues.pop((uid, kind))
            stranded.extend(queue.requests)
            self.queued_bytes -= sum(r.nbytes for r in queue.requests)
            self._queued -= len(queue.requests)
        jobs = [r for r in self._jobs if r.uid == uid]
        self._jobs = deque(r for r in self._jobs if r.uid != uid)
        self._owed.pop(uid, None)
        for key in [k for k in self._costs if k.uid == uid]:
            del self._costs[key]
        return stranded + jobs

    def queued(self, uid: str) -> int:
        """Requests of ``uid`` waiting now (forwards and backwards)."""
        return sum(len(self._queues[uid, kind].requests) for kind in (Kind.FORWARD, Kind.BACKWARD))

    def cost(self, key: CostKey) -> Cost | None:
        """The last learnt cost of ``key`` (None: not learnt yet)."""
        costs = self._costs.get(key)
        return costs[-1] if costs else None

    def estimate(self, key: CostKey, samples: int = 1) -> float | None:
        """Seconds a run of ``key`` on ``samples`` samples takes, by the cheapest of its last
        ``COSTS_REMEMBERED`` runs (each scaled up to ``samples``, never down: a run has fixed
        costs); None while none is learnt."""
        costs = self._costs.get(key)
        if not costs:
            return None
        return min([cost.seconds * max(1.0, samples / max(cost.samples, 1)) for cost in costs])  # a list: no resume per cost

    @property
    def owed(self) -> list[str]:
        """Experts owing an optimizer step, in the order they will get it."""
        return list(self._owed)

    @property
    def jobs(self) -> int:
        """Jobs waiting now."""
        return len(self._jobs)

    @property
    def pending(self) -> bool:
        """Whether there is work for the worker once nothing runs: an owed step, a job, or a
        queued request. (A driver need not wake an idle worker when there is none.)"""
        return bool(self._owed or self._jobs or self._queued)

    @property
    def exhausted(self) -> bool:
        """Closing, and nothing left to run: the worker may stop."""
        return self.closing and self.running is None and not self._owed and not self._jobs and not self._queued

    # --- submission (the event loop) ------------------------------------------------------------
    def submit(self, request: Request, now: float) -> Inline | Queued | Busy:
        """Take a forward, backward or job: run it inline, queue it, or refuse it (a bound is
        reached). Raises when the runtime is closing, paused (forwards and backwards only), or
        does not serve the request's expert."""
        if self.closing:
            raise ExpertUnavailableError("the expert runtime is not running")
        if request.kind in BATCH_KINDS:
            if self.paused:
                raise ExpertPausedError("this volunteer paused its experts")
            queue = self._queues.get((request.uid, request.kind))
            if queue is None:
                raise UnknownExpertError(f"no expert {request.uid!r} here")
            if len(queue.requests) >= self.config.max_queue:
                return Busy(f"expert {request.uid!r}: {len(queue.requests)} {request.kind.value} requests queued")
            if self.queued_bytes + request.nbytes > self.config.max_queue_bytes:
                return Busy(f"the runtime holds {self.queued_bytes} bytes of queued inputs")
        elif request.kind in JOB_KINDS:
            if request.uid and (request.uid, Kind.FORWARD) not in self._queues:
                raise UnknownExpertError(f"no expert {request.uid!r} here")
            if len(self._jobs) >= self.config.max_queue:
                return Busy("the runtime's call queue is full")
        else:
            raise LocalProtocolError(f"a {request.kind.value} is owed by a backward, never submitted")
        request.submitted = now
        if self._may_inline(request):
            self.running = Job(request.kind, request.uid, [request], inline=True)
            return Inline(self.running)
        if request.kind in JOB_KINDS:
            self._jobs.append(request)
        else:
            queue = self._queues[(request.uid, request.kind)]  # checked above
            queue.requests.append(request)
            queue.samples += request.batch
            self.queued_bytes += request.nbytes
            self._queued += 1
        return QUEUED

    def _may_inline(self, request: Request) -> bool:
        limit = self.config.inline_compute_limit
        if limit <= 0 or not request.uid or self.running is not None or self._queued or self._jobs or self._owed:
            return False
        if request.kind in BATCH_KINDS and request.batch < self.config.min_batch_size:
            return False  # the worker would wait for more samples: so would an inline run
        seconds = self.estimate(CostKey(request.uid, request.kind), request.batch if request.kind in BATCH_KINDS else 1)
        return seconds is not None and seconds <= limit

    def cancel(self, request: Request) -> bool:
        """The caller stopped waiting: take ``request`` out of its queue. False when it is not
        queued (taken into a job already, stranded, or never queued)."""
        if request.kind in JOB_KINDS:
            if request in self._jobs:
                self._jobs.remove(request)
                return True
            return False
        queue = self._queues.get((request.uid, request.kind))
        if queue is None or request not in queue.requests:
            return False
        queue.requests.remove(request)
        queue.samples -= request.batch
        self.queued_bytes -= request.nbytes
        self._queued -= 1
        return True

    def step_inline(self) -> Job | None:
        """An owed step to apply on the caller's thread now (the runtime is idle and the expert's
        last step took at most ``inline_compute_limit``), or None: the worker applies it."""
        limit = self.config.inline_compute_limit
        if not self._owed or self.running is not None or limit <= 0:
            return None
        uid = next(iter(self._owed))
        seconds = self.estimate(CostKey(uid, Kind.STEP))
        if seconds is None or seconds > limit:
            return None
        del self._owed[uid]
        self.running = Job(Kind.STEP, uid, inline=True)
        return self.running

    # --- the worker ---------------------------------------------------------------------------------
    def next_job(self, now: float) -> Job | None:
        """What the worker runs next, now taken out of the queues: an owed step, a job, or a ready
        batch; None when a job runs or nothing is ready (``wait`` says for how long)."""
        if self.running is not None:
            return None
        if self._owed:
            uid = next(iter(self._owed))
            del self._owed[uid]
            self.running = Job(Kind.STEP, uid)
        elif self._jobs:
            request = self._jobs.popleft()
            self.running = Job(request.kind, request.uid, [request])
        else:
            batch = self._take_batch(now)
            if not batch:
                return None
            self.running = Job(batch[0].kind, batch[0].uid, batch)
        return self.running

    def wait(self, now: float) -> float | None:
        """Seconds until a queued request's window ends and ``next_job`` has a batch for it; None
        when only a change can give the worker something (a submit, a job finishing)."""
        heads = [queue.requests[0].submitted for queue in self._queues.values() if queue.requests]
        if self.running is not None or not heads:
            return None
        return max(0.0, min(heads) + self.config.batch_window - now)

    def _take_batch(self, now: float) -> list[Request]:
        best = None
        for queue in self._queues.values():
            if not queue.requests:
                continue
            head = queue.requests[0]
            if queue.samples >= self.config.min_batch_size or now >= head.submitted + self.config.batch_window:
                if best is None or head.submitted < best.requests[0].submitted:
                    best = queue
        if best is None:
            return []
        head = best.requests[0]
        batch: list[Request] = []
        kept: deque[Request] = deque()
        samples = 0
        for request in best.requests:
            if request.key == head.key and samples + request.batch <= self.config.max_batch_size:
                batch.append(request)
                samples += request.batch
            else:
                kept.append(request)
        best.requests = kept
        best.samples -= samples
        self.queued_bytes -= sum(r.nbytes for r in batch)
        self._queued -= len(batch)
        return batch

    def finished(self, job: Job, seconds: float | None, *, step_owed: bool = False) -> Job | None:
        """``job`` is done. ``seconds``: how long it took, to learn as its cost key's cost (None
        when it ran in pieces or not at all: nothing to learn). ``step_owed``: a backward left
        its optimizer step deferred. Returns the job the same runner must run next before it
        lets go: the owed step of a batch the worker computed (its callers are woken meanwhile).
        Call this before waking the job's callers, so their next requests find the runtime idle."""
        if job is not self.running:
            raise LocalProtocolError("finished() of a job that is not the one running")
        self.running = None
        hosted = (job.uid, Kind.FORWARD) in self._queues
        if not hosted:
            return None  # removed meanwhile: its costs went with it, a step it owes with its backend
        if seconds is not None:
            samples = sum(r.batch for r in job.requests) if job.kind in BATCH_KINDS else 1
            costs = self._costs.get(job.cost_key)
            if costs is None:
                costs = self._costs[job.cost_key] = deque(maxlen=COSTS_REMEMBERED)
            costs.append(Cost(seconds, samples))
        if not step_owed or job.kind is not Kind.BACKWARD:
            return None
        if job.inline:
            self._owed[job.uid] = None  # before anything else runs, by the worker or step_inline
            return None
        self.running = Job(Kind.STEP, job.uid)
        return self.running

    # --- states ------------------------------------------------------------------------------------
    def pause(self) -> None:
        """Refuse new forwards and backwards (ExpertPausedError); queued ones still run."""
        self.paused = True

    def resume(self) -> None:
        """Accept forwards and backwards again."""
        self.paused = False

    def close(self) -> list[Request]:
        """Refuse everything from now on; returns every queued request and job (the caller fails
        them). Owed steps are still handed out, then ``exhausted`` says the worker may stop."""
        self.closing = True
        stranded = [r for q in self._queues.values() for r in q.requests] + list(self._jobs)
        for queue in self._queues.values():
            queue.requests.clear()
            queue.samples = 0
        self._jobs.clear()
        self.queued_bytes = 0
        self._queued = 0
        return stranded


__all__ = ["COSTS_REMEMBERED", "QUEUED", "Busy", "Cost", "CostKey", "Inline", "Job", "Queued", "Scheduler"]
