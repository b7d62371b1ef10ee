"""The batching runtime: requests from many trainers, per expert, on one torch worker thread.

This module is the driver; the rules live in ``scheduler.py``, a synchronous core that decides
what runs, in which order and where (owed optimizer steps first, then jobs, then batches; a cheap
lone request inline on the event loop; the queue bounds; pause; experts coming and going). Here
are only the worker thread, the ``threading.Condition`` around the core, the trio wake-ups and
the torch calls.

Hand-offs (measured in tests/integration/test_experts_runtime.py): the trio side checks a
request's metadata (count, dtypes, shapes: no kernels), submits it to the core under the lock and
waits on a ``trio.Event``. The worker takes its next job from the core, runs it (one batched
forward or backward whose outputs are split back, an owed step, or a job), tells the core it
finished, and only then wakes the waiters, with one ``TrioToken.run_sync_soon`` per job: a woken
caller's next request finds the runtime idle and may run inline. That is two thread hand-offs
per batch and no trio task per request; ``trio.to_thread.run_sync`` per batch would add a
thread-cache round trip and could land torch on different OS threads.

The shortcuts for the one-trainer case, where latency is what counts:
- a request the core answers ``Inline`` runs right here on the event loop;
- a backward's optimizer step is deferred so the reply leaves first. After a batch the worker
  computed, it applies the step at once; after an inline backward the server applies it itself
  once the reply is written (``apply_owed_steps``: on the event loop when the step is cheap, so
  the trainer's next forward finds the runtime idle and runs inline too; else on the worker).
  ``backend.updates`` counts the step at once, and every backend method settles an owed step
  before it computes or exports, so nothing sees the parameters without it;
- a lone forward keeps its autograd graph (``activations.py``), so its backward need not
  recompute it when nothing changed in between.

If a batched call raises, its requests run one by one, so only the culprit gets the error (for
backward this costs extra optimizer steps: one per request instead of one per batch). On exit
every backend with a checkpoint path and new updates is saved, even when the body was cancelled.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

import torch
import trio

from ..errors import (
    ExpertBusyError,
    ExpertConfigError,
    ExpertUnavailableError,
    LocalProtocolError,
    UnknownExpertError,
    describe,
)
from .activations import ActivationCache
from .backend import ExpertBackend
from .config import DEFAULT_CONFIG, ExpertsConfig
from .judge import TrainerJudge, TrainersStatus
from .requests import BATCH_KINDS, JOB_KINDS, Kind, Request, concat, hand_out, wake
from .scheduler import QUEUED, Busy, Inline, Job, Scheduler
from .snapshots import SnapshotStore
from .schema import check_finite
from .stats import ExpertStats, Ledger

log = logging.getLogger(__name__)


class Runtime:
    """Serves forward/backward calls for a set of backends. Create it with ``open_runtime``."""

    def __init__(self, backends: Iterable[ExpertBackend], config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self.backends: dict[str, ExpertBackend] = {}
        for backend in backends:
            if backend.uid in self.backends:
                raise ExpertConfigError(f"two backends share the uid {backend.uid!r}")
            self.backends[backend.uid] = backend
        self._core = Scheduler(self.backends, config)
        self.judge = TrainerJudge(self.backends, config)  # trainers' strikes, refusals, rollbacks
        # the states replies were computed from, for exact audits; copied on a thread of its own
        # while replies travel: every write of an expert's state first settles its copies
        self.snapshots = SnapshotStore(background=True)
        self._ledger = Ledger(config.latency_window)
        for uid in self.backends:
            self._ledger.add(uid)
        # guards the core, the ledger and the activations; taken as ``with self._lock`` (the lock's
        # own C context manager: Condition's is Python, and a call takes it four times)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._crashed: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self.activations = ActivationCache(
            config.activation_cache_entries, config.activation_cache_bytes, config.activation_cache_ttl
        )

    # --- public API (trio thread) -------------------------------------------------------------

    async def forward(
        self, uid: str, inputs: Sequence[torch.Tensor], *, keep_graph: bool = False, stamps: list | None = None,
    ) -> list[torch.Tensor]:
        """The expert's outputs for one request (batched with others). Raises ExpertInputError,
        ExpertBusyError, ExpertPausedError, UnknownExpertError, or what the expert raised.
        ``keep_graph``: the caller will send the backward of these inputs; if computed alone,
        the forward's graph is kept for it (``activations.py``). ``stamps``: gets the (stamp of
        the state, rows computed together) appended, for the reply's receipt (``snapshots.py``)."""
        batch = self._backend(uid).check_inputs(inputs, nan_check=False)
        request = Request(uid, Kind.FORWARD, inputs, batch=batch, waiter=trio.Event(), keep_graph=keep_graph)
        result = await self._submit(request)
        if stamps is not None:
            stamps.append(request.stamp)
        return result

    async def backward(
        self,
        uid: str,
        inputs: Sequence[torch.Tensor],
        grad_outputs: Sequence[torch.Tensor],
        *,
        settle_later: bool = False,
        trainer: object = None,
        stamps: list | None = None,
    ) -> list[torch.Tensor]:
        """Gradients of the inputs for one request; the expert takes an optimizer step per batch.
        ``settle_later``: the caller calls ``apply_owed_steps()`` once it has sent the result (a
        step owed by a backward computed on the event loop then waits for it, or for the next
        request, whichever comes first). ``trainer``: who sent it (a peer ID), whose gradients
        the expert's bound judges (``judge.py``); TrainerRefusedError if it is refused now."""
        batch = self._backend(uid).check_backward(inputs, grad_outputs, nan_check=False)
        self.check_trainer(uid, trainer)
        request = Request(
            uid, Kind.BACKWARD, inputs, grad_outputs, batch=batch, waiter=trio.Event(), settle_later=settle_later,
            trainer=trainer,
        )
        result = await self._submit(request)
        if stamps is not None:
            stamps.append(request.stamp)  # the state before the step this backward owes
        return result

    def check_trainer(self, uid: str, trainer: object) -> None:
        """Raise TrainerRefusedError if ``trainer``'s backwards on ``uid`` are refused now (refused
        for cause, or past its share while others train the expert); counted per trainer."""
        with self._lock:
            refusal = self.judge.refusal(uid, trainer, time.perf_counter())
        if refusal is not None:
            raise refusal

    def trainer_report(self) -> TrainersStatus:
        """Per-trainer counts (applied, clipped, refused, seconds of refusal left) and rollbacks."""
        with self._lock:
            return self.judge.snapshot(time.perf_counter())

    def suspect(self, uid: str) -> bool:
        """Whether ``uid`` took a clipped gradient that may yet be undone: not a reference for
        other replicas (sync, catch-up) until its trainer is cleared or refused."""
        backend = self.backends.get(uid)
        if backend is None or not backend.suspect:
            return False
        with self._lock:  # once the strikes behind it expire, its next backward lets the kept state go
            return self.judge.book.open_strikes(uid, time.perf_counter())

    def apply_owed_steps(self) -> None:
        """A backward's result is sent: apply the optimizer steps owed now. A cheap step (one of
        the expert's recent steps took at most ``inline_compute_limit``) runs right here on the
        event loop, while the caller reads its reply: the next forward then finds the runtime idle and runs
        inline too, with no hand-off to the worker and back. Others go to the worker."""
        with self._lock:
            job = self._core.step_inline()
            if job is None:
                if self._core.pending:
                    self._cond.notify()
                return
        self._run_inline(job)

    async def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the worker thread between batches (torch work that must not race
        the experts or block trio: compressing a large reply, an on-demand checkpoint)."""
        return await self._submit(Request("", Kind.JOB, waiter=trio.Event(), work=functools.partial(fn, *args)))

    async def run_on(self, uid: str, fn: Callable[..., Any], *args: Any, kind: Kind = Kind.JOB) -> Any:
        """Run ``fn(*args)``, work on expert ``uid``'s state (a sync round's average: ``kind``
        ``Kind.AVERAGE``), between its batches and after any step it owes. It runs on the event
        loop when a forward would (the runtime idle, a recent ``kind`` job on ``uid`` took at most
        ``inline_compute_limit``), else on the worker. UnknownExpertError if ``uid`` is not served;
        ExpertUnavailableError if it is removed before the job runs."""
        if kind not in JOB_KINDS:
            raise LocalProtocolError(f"run_on runs jobs, not a {kind.value}")
        return await self._submit(Request(uid, kind, waiter=trio.Event(), work=functools.partial(fn, *args)))

    async def settled(self) -> None:
        """Return once every optimizer step owed by an answered backward is applied. Read a
        backend's state on the event loop only after this (or through ``run_sync``): a backward
        replies before its step (the worker applies owed steps before any other job)."""
        await self.run_sync(_nothing)

    def info(self, uid: str) -> dict:
        """The expert's metadata (schema, class, updates) for the expert-info reply."""
        return self._backend(uid).info()

    @property
    def uids(self) -> list[str]:
        """Uids of the experts this runtime serves."""
        return list(self.backends)

    def pause(self) -> None:
        """Refuse new requests with ExpertPausedError; queued ones still run."""
        with self._lock:
            self._core.pause()

    def resume(self) -> None:
        """Accept requests again after ``pause()``."""
        with self._lock:
            self._core.resume()

    @property
    def paused(self) -> bool:
        """Whether new requests are refused."""
        return self._core.paused

    def stats(self) -> dict[str, ExpertStats]:
        """A snapshot of every expert's counters."""
        with self._lock:
            return {
                uid: self._ledger.snapshot(uid, queued=self._core.queued(uid), updates=self.backends[uid].updates)
                for uid in self._ledger.uids
            }

    # --- hosting changes while running (replicas: placement, hand-off receivers) ---------------
    def add_backend(self, backend: ExpertBackend) -> None:
        """Serve ``backend`` from now on (its state already loaded: a caught-up or pushed expert)."""
        with self._lock:
            self._core.add(backend.uid)  # ExpertConfigError if it is served already
            self._ledger.add(backend.uid)
            self.backends[backend.uid] = backend

    def remove_backend(self, uid: str) -> ExpertBackend:
        """Stop serving ``uid`` and return its backend (the caller saves it if it wants to):
        requests and jobs still queued for it fail with ExpertUnavailableError; one being
        computed finishes."""
        with self._lock:
            backend = self.backends.pop(uid, None)
            if backend is None:
                raise UnknownExpertError(f"no expert {uid!r} here")
            stranded = self._core.remove(uid)
            self._ledger.remove(uid)
            self.judge.forget(uid)
            self.activations.drop(uid)
        for request in stranded:
            request.error = ExpertUnavailableError(f"this volunteer no longer hosts {uid!r}")
        wake(stranded)
        return backend

    # --- submission -------------------------------------------------------------------------------

    def _backend(self, uid: str) -> ExpertBackend:
        backend = self.backends.get(uid)
        if backend is None:
            raise UnknownExpertError(f"no expert {uid!r} here")
        return backend

    def _check_open(self) -> None:
        if self._crashed is not None:
            raise ExpertUnavailableError(f"the expert runtime crashed: {describe(self._crashed)}")
        if self._core.closing or self._thread is None:
            raise ExpertUnavailableError("the expert runtime is not running")

    async def _submit(self, request: Request) -> Any:
        self._check_open()
        with self._lock:
            decision = self._core.submit(request, time.perf_counter())
            if isinstance(decision, Busy):
                if request.kind in BATCH_KINDS:
                    self._ledger.busy(request.uid)
                raise ExpertBusyError(decision.reason)
            self._ledger.accepted(request)
            if decision is QUEUED:
                self._cond.notify()
        if isinstance(decision, Inline):
            self._run_inline(decision.job)
            return _outcome(request)
        try:
            await request.waiter.wait()
        except BaseException:
            request.gone = True  # taken into a batch already: the worker skips it
            with self._lock:
                self._core.cancel(request)
            raise
        return _outcome(request)

    def _run_inline(self, job: Job) -> None:
        """Run a job the core gave the event loop; the worker stays out until it ends."""
        seconds, owed = None, False
        try:
            seconds, owed = self._perform(job, self.backends.get(job.uid))
        finally:
            with self._lock:
                self._core.finished(job, seconds, step_owed=owed)  # an owed step waits for ...
                if not owed and self._core.pending:
                    self._cond.notify()  # a wake-up for nothing costs the event loop the GIL
        if owed and not job.requests[0].settle_later:
            # ... our caller's reply: woken now, the worker's Python would contend for the GIL
            # with the reply's serialization (a callback runs when the caller's task first
            # yields, which is after its first send)
            trio.lowlevel.current_trio_token().run_sync_soon(self._wake_worker)

    def _wake_worker(self) -> None:
        with self._lock:
            self._cond.notify()

    # --- worker thread ---------------------------------------------------------------------------

    def _start(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._thread = threading.Thread(target=self._work, name="volunteer-experts-runtime", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            follow: Job | None = None  # what the last job handed on (the step its batch owes)
            while True:
                with self._lock:
                    job = follow or self._next_job()
                    if job is None:
                        return
                    backend = self.backends.get(job.uid)
                follow = self._run(job, backend)
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("expert runtime worker crashed")
            self._crashed = exc
            with self._lock:
                running = self._core.running
                stranded = self._core.close()
                if running is not None:
                    stranded += [r for r in running.requests if not r.waiter.is_set()]
            for request in stranded:
                request.result = None
                request.error = ExpertUnavailableError(f"the expert runtime crashed: {describe(exc)}")
            self._deliver(stranded)

    def _next_job(self) -> Job | None:
        """Under the lock: wait for the core's next job; None once it is closed and drained."""
        while True:
            now = time.perf_counter()
            job = self._core.next_job(now)
            if job is not None or self._core.exhausted:
                return job
            self._cond.wait(self._core.wait(now))

    def _run(self, job: Job, backend: ExpertBackend | None) -> Job | None:
        """Run ``job`` on the worker, tell the core, then wake its callers; returns the job the
        core hands on to the worker (the step a batch owes)."""
        seconds, owed = self._perform(job, backend)
        with self._lock:
            follow = self._core.finished(job, seconds, step_owed=owed)
        self._deliver(job.requests)
        return follow

    def _perform(self, job: Job, backend: ExpertBackend | None) -> tuple[float | None, bool]:
        """Run a job on this thread: (seconds to learn as its cost, or None; whether a step is owed)."""
        if job.kind not in BATCH_KINDS:
            self.snapshots.settle_copies()  # a step or a job may write any expert's state
        if job.kind is Kind.STEP:
            return (None if backend is None else self._settle(backend)), False
        if job.kind in BATCH_KINDS:
            if backend is None:  # the scheduler never hands out a batch of an expert it dropped
                raise UnknownExpertError(f"no expert {job.uid!r} here")
            return self._execute(job.requests, backend), backend.step_owed
        (request,) = job.requests
        started = time.perf_counter()
        try:
            request.result = request.job()()
        except Exception as exc:
            request.result, request.error = None, exc
        return time.perf_counter() - started, False

    def _settle(self, backend: ExpertBackend) -> float:
        """Apply ``backend``'s deferred step; forget its kept graphs the step made useless."""
        started = time.perf_counter()
        try:
            backend.settle()
        except Exception as exc:  # the reply is gone: log it and count it on the expert
            log.exception("the optimizer step of expert %s failed", backend.uid)
            with self._lock:
                self._ledger.failed(backend.uid, exc, time.time())
        if self.config.receipts:  # the new version's copy: here, while the reply travels, not before the next batch
            self.snapshots.note(backend)
        took = time.perf_counter() - started
        state = backend.state_fingerprint()
        with self._lock:
            self.activations.drop_stale(backend.uid, state)
        return took

    def _execute(self, batch: list[Request], backend: ExpertBackend) -> float | None:
        """Compute a batch (results and errors into its requests) and count it; returns its
        seconds when it ran whole, in one call (the cost the scheduler learns), else None."""
        live = [r for r in batch if not r.gone]
        if self.config.nan_check:
            live = [r for r in live if self._finite(r)]
        runs = 0  # forward/backward calls that succeeded
        started = time.perf_counter()
        if len(live) > 1:
            try:
                self._compute(live, backend)
                runs = 1
            except Exception:
                for request in live:  # find the culprit: each alone, so only it fails
                    runs += self._compute_alone(request, backend)
        elif live:
            runs = self._compute_alone(live[0], backend)
        done = time.perf_counter()
        if batch[0].kind is Kind.BACKWARD:
            self.snapshots.settle_copies()  # the judge may roll back any expert its trainer struck
        with self._lock:
            if batch[0].kind is Kind.BACKWARD:
                self.judge.judge(backend.uid, live, done)
            samples = sum(r.batch for r in live if r.error is None)
            self._ledger.computed(
                batch[0].uid, batch, runs=runs, samples=samples, seconds=done - started, done=done, wall=time.time()
            )
        return done - started if runs == 1 and len(live) == len(batch) else None

    def _finite(self, request: Request) -> bool:
        try:
            check_finite(request.inputs)
            if request.grads is not None:
                check_finite(request.grads, what="gradient")
        except Exception as exc:
            request.error = exc
            return False
        return True

    def _compute_alone(self, request: Request, backend: ExpertBackend) -> bool:
        try:
            self._compute([request], backend)
        except Exception as exc:
            request.error = exc
            return False
        return True

    def _compute(self, batch: list[Request], backend: ExpertBackend) -> None:
        if backend.step_owed:
            self.snapshots.settle_copies(backend.uid)  # the step writes: only reads run beside a copy
        backend.settle()
        if self.config.receipts:  # the state that computes this batch, once per version (snapshots.py)
            stamp = (self.snapshots.note(backend), sum(r.batch for r in batch))
            for request in batch:
                request.stamp = stamp
            if backend.forward_writes_state:
                self.snapshots.settle_copies(backend.uid)  # this batch writes buffers: copied first
        if len(batch) == 1 and self.activations.enabled and self._compute_with_graph(backend, batch[0]):
            return
        inputs = concat([r.inputs for r in batch])
        if batch[0].kind is Kind.FORWARD:
            outputs = backend.forward(inputs, validate=False)
        else:
            # one author: its gradient is judged whole; several: a clip splits the batch, so
            # that each trainer's gradient is judged alone (the culprit's, not everyone's)
            trainers = {r.trainer for r in batch}
            sender = batch[0].trainer if len(trainers) == 1 else None
            outputs = backend.backward(
                inputs, concat([r.gradients() for r in batch]), validate=False, defer_step=True, sender=sender,
                refuse_clipped=len(trainers) > 1 or self._newcomer(sender), parts=len(batch),
            )
            for request in batch:
                request.check = backend.last_check
        hand_out(batch, outputs)

    def _compute_with_graph(self, backend: ExpertBackend, request: Request) -> bool:
        """A lone forward that announced its backward keeps its graph; a lone backward uses the
        kept graph of its inputs if the expert did not change since. False: compute it the
        ordinary way. (Batches of several requests recompute: one graph per request would cost a
        backward pass per request.)"""
        if request.kind is Kind.FORWARD:
            if not request.keep_graph:
                return False  # no backward announced: a graph would only hold memory
            request.result, graph = backend.forward_keeping_graph(request.inputs)
            with self._lock:
                self.activations.put(request.uid, graph, now=time.perf_counter())
            return True
        state = backend.state_fingerprint()
        with self._lock:
            kept = self.activations.take(request.uid, request.inputs, state, now=time.perf_counter())
        if kept is None:
            return False
        request.result = backend.backward_from_graph(
            kept, request.gradients(), defer_step=True, sender=request.trainer, refuse_clipped=self._newcomer(request.trainer)
        )
        request.check = backend.last_check
        return True

    def _newcomer(self, trainer: object) -> bool:
        """Whether ``trainer`` is too new here for a clipped gradient of its to be applied (fresh
        identities cost nothing: each would bring its own strikes)."""
        with self._lock:
            return self.judge.newcomer(trainer)

    def _deliver(self, requests: list[Request]) -> None:
        if not requests:
            return
        if self._token is None:
            raise LocalProtocolError("the runtime delivered results before it started")
        try:
            self._token.run_sync_soon(wake, requests)
        except trio.RunFinishedError:
            pass  # trio is gone: nobody is waiting any more

    # --- shutdown -----------------------------------------------------------------------------------

    async def _aclose(self) -> list[BaseException]:
        """Stop the worker, fail what is still queued, save checkpoints; returns save failures."""
        with self._lock:
            stranded = self._core.close()
            self.activations.clear()
            self._cond.notify()
        for request in stranded:
            request.error = ExpertUnavailableError("the expert runtime is shutting down")
        wake(stranded)
        if self._thread is not None:
            await trio.to_thread.run_sync(self._thread.join)
        await trio.to_thread.run_sync(self.snapshots.close)
        return await trio.to_thread.run_sync(self._save_all)

    def _save_all(self) -> list[BaseException]:
        failures: list[BaseException] = []
        for backend in self.backends.values():
            if backend.checkpoint_path is not None and backend.dirty:
                try:
                    backend.save_checkpoint()
                except Exception as exc:
                    log.exception("checkpoint of expert %s failed", backend.uid)
                    failures.append(exc)
        return failures


def _outcome(request: Request) -> Any:
    """A finished request's result, or its error raised (dropped from the request first: no
    cycle through the traceback)."""
    if request.error is not None:
        error, request.error = request.error, None
        raise error
    return request.result


def _nothing() -> None:
    pass


@asynccontextmanager
async def open_runtime(
    backends: Iterable[ExpertBackend] | Mapping[str, ExpertBackend], config: ExpertsConfig = DEFAULT_CONFIG
) -> AsyncIterator[Runtime]:
    """Start the worker thread; on exit (even cancelled) stop it and checkpoint every backend
    with new updates. A failed checkpoint is logged, and raised if the body exited normally."""
    if isinstance(backends, Mapping):
        backends = backends.values()
    runtime = Runtime(backends, config)
    runtime._start(trio.lowlevel.current_trio_token())
    try:
        yield runtime
    finally:
        with trio.CancelScope(shield=True):
            failures = await runtime._aclose()
    if failures:
        raise failures[0]
