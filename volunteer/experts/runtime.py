"""The batching runtime: requests from many trainers, per expert, on one torch worker thread.

Design (measured in tests/integration/test_experts_runtime.py): a dedicated worker thread owns
every torch call but the cheap inline ones below. The trio side checks a request's metadata
(count, dtypes, shapes: no kernels), appends it to its expert's bounded queue under a
``threading.Condition`` and waits on a ``trio.Event``. The worker picks the ready queue whose
oldest request is oldest, takes compatible requests up to ``max_batch_size`` samples, runs one
batched forward or backward, splits the outputs back, and wakes the waiters with one
``TrioToken.run_sync_soon`` per batch. That is two thread hand-offs per batch and no trio task
per request; ``trio.to_thread.run_sync`` per batch would add a thread-cache round trip and could
land torch on different OS threads.

Three shortcuts for the one-trainer case, where latency is what counts:
- A request that the worker would take at once (nothing queued, nothing running) and that is
  cheap (its kind of call on that expert last took at most ``inline_compute_limit``) runs right
  on the event loop, without the two hand-offs.
- A backward's optimizer step is deferred: the reply leaves first, and the step is applied
  right after, before anything else computes. The worker applies it after a batch it
  computed; after an inline backward the server applies it itself once the reply is written
  (``apply_owed_steps``: on the event loop when the step is cheap, so the trainer's next
  forward finds the runtime idle and runs inline too; else on the worker). ``backend.updates``
  counts the step at once, and every backend method settles an owed step before it computes
  or exports, so nothing sees the parameters without it.
- A lone forward keeps its autograd graph (``activations.py``), so its backward need not
  recompute it when nothing changed in between.

Batching: a queue is ready once it holds ``min_batch_size`` samples or its oldest request has
waited ``batch_window`` seconds. With the default ``min_batch_size=1`` an idle worker runs at
once, and batches form from what arrives while it computes. Requests are batched only with
requests of the same sizes after the batch dim. If a batched call raises, its requests run one
by one, so only the culprit gets the error (for backward this costs extra optimizer steps: one
per request instead of one per batch).

Bounds: ``max_queue`` requests per expert and kind, ``max_queue_bytes`` of queued inputs in all;
beyond either, a request fails at once with ExpertBusyError. ``pause()`` refuses new requests
with ExpertPausedError (queued ones still run). On exit every backend with a checkpoint path and
new updates is saved, even when the body was cancelled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

import torch
import trio

from ..errors import (
    ExpertBusyError,
    ExpertConfigError,
    ExpertPausedError,
    ExpertUnavailableError,
    UnknownExpertError,
    describe,
)
from .activations import ActivationCache
from .backend import ExpertBackend
from .config import DEFAULT_CONFIG, ExpertsConfig
from .requests import Queue as _Queue
from .requests import Request as _Request
from .requests import concat as _concat
from .requests import hand_out as _hand_out
from .requests import nbytes as _nbytes
from .requests import take_batch as _take_batch
from .requests import wake as _wake
from .schema import check_finite
from .stats import Counters as _Counters
from .stats import ExpertStats

log = logging.getLogger(__name__)

FORWARD = "forward"
BACKWARD = "backward"
STEP = "step"  # an optimizer step owed by a backward (its cost decides where it runs)


class Runtime:
    """Serves forward/backward calls for a set of backends. Create it with ``open_runtime``."""

    def __init__(self, backends: Iterable[ExpertBackend], config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self.backends: dict[str, ExpertBackend] = {}
        for backend in backends:
            if backend.uid in self.backends:
                raise ExpertConfigError(f"two backends share the uid {backend.uid!r}")
            self.backends[backend.uid] = backend
        self._cond = threading.Condition()
        self._queues = {(uid, kind): _Queue() for uid in self.backends for kind in (FORWARD, BACKWARD)}
        self._calls: deque[_Request] = deque()  # run_sync jobs, before any batch
        self._counters = {uid: _Counters() for uid in self.backends}
        self._queued_bytes = 0
        self._paused = False
        self._closing = False
        self._crashed: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._running: list[_Request] = []  # taken by the worker, not yet delivered
        self._working = False  # the worker holds a job, or an inline computation runs
        self._queued = 0  # requests in all queues
        self._owed: deque[ExpertBackend] = deque()  # deferred steps the worker applies next
        self._cost: dict[tuple[str, str], tuple[float, int]] = {}  # last (seconds, samples) per uid, kind
        self.activations = ActivationCache(
            config.activation_cache_entries, config.activation_cache_bytes, config.activation_cache_ttl
        )

    # --- public API (trio thread) -------------------------------------------------------------

    async def forward(self, uid: str, inputs: Sequence[torch.Tensor], *, keep_graph: bool = False) -> list[torch.Tensor]:
        """The expert's outputs for one request (batched with others). Raises ExpertInputError,
        ExpertBusyError, ExpertPausedError, UnknownExpertError, or what the expert raised.
        ``keep_graph``: the caller will send the backward of these inputs; if computed alone,
        the forward's graph is kept for it (``activations.py``)."""
        backend = self._backend(uid)
        batch = backend.check_inputs(inputs, nan_check=False)
        request = _Request(uid, FORWARD, list(inputs), None, batch, _nbytes(inputs))
        request.keep_graph = keep_graph
        return await self._submit(request)

    async def backward(
        self,
        uid: str,
        inputs: Sequence[torch.Tensor],
        grad_outputs: Sequence[torch.Tensor],
        *,
        settle_later: bool = False,
    ) -> list[torch.Tensor]:
        """Gradients of the inputs for one request; the expert takes an optimizer step per batch.
        ``settle_later``: the caller calls ``apply_owed_steps()`` once it has sent the result (a
        step owed by a backward computed on the event loop then waits for it, or for the next
        request, whichever comes first)."""
        backend = self._backend(uid)
        batch = backend.check_backward(inputs, grad_outputs, nan_check=False)
        nbytes = _nbytes(inputs) + _nbytes(grad_outputs)
        request = _Request(uid, BACKWARD, list(inputs), list(grad_outputs), batch, nbytes)
        request.settle_later = settle_later
        return await self._submit(request)

    def apply_owed_steps(self) -> None:
        """A backward's result is sent: apply the optimizer steps owed now. A cheap step (the
        expert's last took at most ``inline_compute_limit``) runs right here on the event loop,
        while the caller reads its reply: the next forward then finds the runtime idle and runs
        inline too, with no hand-off to the worker and back. Others go to the worker."""
        with self._cond:
            if not self._owed:
                return
            last = self._cost.get((self._owed[0].uid, STEP))
            if self._working or last is None or last[0] > self.config.inline_compute_limit:
                self._cond.notify()
                return
            backend = self._owed.popleft()
            self._working = True
        try:
            self._settle(backend)
        finally:
            with self._cond:
                self._working = False
                self._cond.notify()

    async def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the worker thread between batches (torch work that must not race
        the experts or block trio: compressing a large reply, an on-demand checkpoint)."""
        self._check_open()
        call = _Request("", "call", [], None, 0, 0)
        call.result = (fn, args)  # the job rides in the result slot until the worker replaces it
        with self._cond:
            if len(self._calls) >= self.config.max_queue:
                raise ExpertBusyError("the runtime's call queue is full")
            self._calls.append(call)
            self._cond.notify()
        return await self._wait(call)

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
        self._paused = True

    def resume(self) -> None:
        """Accept requests again after ``pause()``."""
        self._paused = False

    @property
    def paused(self) -> bool:
        """Whether new requests are refused."""
        return self._paused

    def stats(self) -> dict[str, ExpertStats]:
        """A snapshot of every expert's counters."""
        with self._cond:
            return {
                uid: c.snapshot(
                    uid,
                    queued=sum(len(self._queues[uid, kind].requests) for kind in (FORWARD, BACKWARD)),
                    updates=self.backends[uid].updates,
                )
                for uid, c in self._counters.items()
            }

    # --- hosting changes while running (replicas: placement, hand-off receivers) ---------------
    def add_backend(self, backend: ExpertBackend) -> None:
        """Serve ``backend`` from now on (its state already loaded: a caught-up or pushed expert)."""
        with self._cond:
            if backend.uid in self.backends:
                raise ExpertConfigError(f"this runtime already serves {backend.uid!r}")
            for kind in (FORWARD, BACKWARD):
                self._queues[backend.uid, kind] = _Queue()
            self._counters[backend.uid] = _Counters()
            self.backends[backend.uid] = backend

    def remove_backend(self, uid: str) -> ExpertBackend:
        """Stop serving ``uid`` and return its backend (the caller saves it if it wants to):
        requests still queued for it fail with ExpertUnavailableError; one being computed finishes."""
        with self._cond:
            backend = self.backends.pop(uid, None)
            if backend is None:
                raise UnknownExpertError(f"no expert {uid!r} here")
            stranded: list[_Request] = []
            for kind in (FORWARD, BACKWARD):
                queue = self._queues.pop((uid, kind))
                stranded.extend(queue.requests)
                self._queued_bytes -= sum(r.nbytes for r in queue.requests)
            del self._counters[uid]
            self._queued -= len(stranded)
            self.activations.drop(uid)
            for kind in (FORWARD, BACKWARD, STEP):
                self._cost.pop((uid, kind), None)
        for request in stranded:
            request.error = ExpertUnavailableError(f"this volunteer no longer hosts {uid!r}")
        _wake(stranded)
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
        if self._closing or self._thread is None:
            raise ExpertUnavailableError("the expert runtime is not running")

    async def _submit(self, request: _Request) -> list[torch.Tensor]:
        self._check_open()
        if self._paused:
            raise ExpertPausedError("this volunteer paused its experts")
        queue = self._queues[request.uid, request.kind]
        with self._cond:
            counters = self._counters[request.uid]
            if len(queue.requests) >= self.config.max_queue:
                counters.busy += 1
                raise ExpertBusyError(f"expert {request.uid!r}: {len(queue.requests)} {request.kind} requests queued")
            if self._queued_bytes + request.nbytes > self.config.max_queue_bytes:
                counters.busy += 1
                raise ExpertBusyError(f"the runtime holds {self._queued_bytes} bytes of queued inputs")
            if request.kind == FORWARD:
                counters.forward += 1
            else:
                counters.backward += 1
            inline = self._may_inline(request)
            if inline:
                self._working = True  # the worker stays out until this computation ends
            else:
                queue.requests.append(request)
                queue.samples += request.batch
                self._queued_bytes += request.nbytes
                self._queued += 1
                self._cond.notify()
        if inline:
            return self._run_inline(request)
        return await self._wait(request, queue)

    def _wake_worker(self) -> None:
        with self._cond:
            self._cond.notify()

    def _may_inline(self, request: _Request) -> bool:
        """Under the lock: whether ``request`` would be the worker's next batch, alone, and is
        cheap enough to compute on the event loop (its last like call took <= the limit)."""
        limit = self.config.inline_compute_limit
        last = self._cost.get((request.uid, request.kind))
        if limit <= 0 or last is None or self._working or self._queued or self._calls or self._owed:
            return False
        seconds, samples = last
        return request.batch >= self.config.min_batch_size and seconds * max(1.0, request.batch / samples) <= limit

    def _run_inline(self, request: _Request) -> list[torch.Tensor]:
        backend = None
        try:
            backend = self._execute([request])
        finally:
            owed = backend is not None and backend.step_owed
            with self._cond:
                self._working = False
                if owed:
                    self._owed.append(backend)  # applied before anything else computes ...
                else:
                    self._cond.notify()
            if owed and not request.settle_later:
                # ... once our caller's reply is written: woken now, the worker's Python would
                # contend for the GIL with the reply's serialization (a callback runs when the
                # caller's task first yields, which is after its first send)
                trio.lowlevel.current_trio_token().run_sync_soon(self._wake_worker)
        if request.error is not None:
            error, request.error = request.error, None
            raise error
        return request.result

    async def _wait(self, request: _Request, queue: _Queue | None = None) -> Any:
        try:
            await request.event.wait()
        except BaseException:
            request.gone = True
            with self._cond:
                if queue is not None and request in queue.requests:
                    queue.requests.remove(request)
                    queue.samples -= request.batch
                    self._queued_bytes -= request.nbytes
                    self._queued -= 1
                elif queue is None and request in self._calls:
                    self._calls.remove(request)
            raise
        if request.error is not None:
            error, request.error = request.error, None  # no cycle through the traceback
            raise error
        return request.result

    # --- worker thread ---------------------------------------------------------------------------

    def _start(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._thread = threading.Thread(target=self._work, name="volunteer-experts-runtime", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            while True:
                owed: ExpertBackend | None = None
                job: _Request | None = None
                batch: list[_Request] = []
                with self._cond:
                    while True:
                        if self._working:  # an inline computation runs on the event loop
                            self._cond.wait()
                            continue
                        if self._owed:
                            owed = self._owed.popleft()
                            break
                        if self._calls:
                            job = self._calls.popleft()
                            break
                        batch, wait = self._pick(time.perf_counter())
                        if batch:
                            break
                        if self._closing:
                            return
                        self._cond.wait(wait)
                    self._working = True
                    self._running = [job] if job is not None else batch
                if owed is not None:
                    self._settle(owed)
                    self._idle()
                elif job is not None:
                    self._call(job)  # goes idle itself
                else:
                    self._run(batch)  # goes idle itself
        except BaseException as exc:  # a bug here must not leave callers waiting forever
            log.exception("expert runtime worker crashed")
            self._crashed = exc
            with self._cond:
                stranded = [r for q in self._queues.values() for r in q.requests] + list(self._calls)
                stranded += [r for r in self._running if not r.event.is_set()]
                for queue in self._queues.values():
                    queue.requests.clear()
                self._calls.clear()
            for request in stranded:
                request.result = None
                request.error = ExpertUnavailableError(f"the expert runtime crashed: {describe(exc)}")
            self._deliver(stranded)

    def _pick(self, now: float) -> tuple[list[_Request], float | None]:
        """Under the lock: take the next batch, or say how long to wait for one."""
        config = self.config
        batch, wait = _take_batch(
            self._queues.values(), now, min_batch_size=config.min_batch_size, max_batch_size=config.max_batch_size,
            batch_window=config.batch_window, closing=self._closing,
        )
        self._queued_bytes -= sum(r.nbytes for r in batch)
        self._queued -= len(batch)
        return batch, wait

    def _call(self, job: _Request) -> None:
        fn, args = job.result
        try:
            job.result = fn(*args)
        except Exception as exc:
            job.result, job.error = None, exc
        self._idle()  # before the wake-up: the woken caller's next request may run inline
        self._deliver([job])

    def _idle(self) -> None:
        with self._cond:
            self._running = []
            self._working = False

    def _run(self, batch: list[_Request]) -> None:
        backend = self._execute(batch)
        if backend is None or not backend.step_owed:
            self._idle()  # before the wake-up: the woken caller's next request may run inline
            self._deliver(batch)
            return
        self._deliver(batch)  # the reply first ...
        self._settle(backend)  # ... then the step, before the worker computes anything else
        self._idle()

    def _settle(self, backend: ExpertBackend) -> None:
        """Apply ``backend``'s deferred step; forget its kept graphs the step made useless."""
        started = time.perf_counter()
        try:
            backend.settle()
        except Exception as exc:  # the reply is gone: log it and count it on the expert
            log.exception("the optimizer step of expert %s failed", backend.uid)
            with self._cond:
                counters = self._counters.get(backend.uid)
                if counters is not None:
                    counters.errors += 1
                    counters.last_error, counters.last_error_time = describe(exc), time.time()
        took = time.perf_counter() - started
        state = backend.state_fingerprint()
        with self._cond:
            if backend.uid in self._counters:
                self._cost[backend.uid, STEP] = (took, 1)
            self.activations.drop_stale(backend.uid, state)

    def _execute(self, batch: list[_Request]) -> ExpertBackend | None:
        """Compute a batch (results and errors into its requests) and count it; returns its
        backend (None if it was removed meanwhile)."""
        backend = self.backends.get(batch[0].uid)
        live = [r for r in batch if not r.gone]
        if self.config.nan_check:
            live = [r for r in live if self._finite(r)]
        runs = 0  # forward/backward calls that succeeded
        started = time.perf_counter()
        if len(live) > 1:
            try:
                self._compute(live)
                runs = 1
            except Exception:
                for request in live:  # find the culprit: each alone, so only it fails
                    runs += self._compute_alone(request)
        elif live:
            runs = self._compute_alone(live[0])
        done = time.perf_counter()
        with self._cond:
            if runs == 1 and len(live) == len(batch) and batch[0].uid in self._counters:
                self._cost[batch[0].uid, batch[0].kind] = (done - started, sum(r.batch for r in live))
            # remove_backend may have dropped the expert while this batch ran: count into a stub
            counters = self._counters.get(batch[0].uid) or _Counters()
            counters.batches += runs
            counters.compute_s += done - started
            counters.samples += sum(r.batch for r in live if r.error is None)
            for request in batch:
                if request.error is not None:
                    counters.errors += 1
                    counters.last_error = describe(request.error)
                    counters.last_error_time = time.time()
                counters.latencies.append(done - request.submitted)
            while len(counters.latencies) > self.config.latency_window:
                counters.latencies.popleft()
        return backend

    def _finite(self, request: _Request) -> bool:
        try:
            check_finite(request.inputs)
            if request.grads is not None:
                check_finite(request.grads, what="gradient")
        except Exception as exc:
            request.error = exc
            return False
        return True

    def _compute_alone(self, request: _Request) -> bool:
        try:
            self._compute([request])
        except Exception as exc:
            request.error = exc
            return False
        return True

    def _compute(self, batch: list[_Request]) -> None:
        backend = self.backends[batch[0].uid]
        backend.settle()
        if len(batch) == 1 and self.activations.enabled and self._compute_with_graph(backend, batch[0]):
            return
        inputs = _concat([r.inputs for r in batch])
        if batch[0].kind == FORWARD:
            outputs = backend.forward(inputs, validate=False)
        else:
            outputs = backend.backward(inputs, _concat([r.grads for r in batch]), validate=False, defer_step=True)
        _hand_out(batch, outputs)

    def _compute_with_graph(self, backend: ExpertBackend, request: _Request) -> bool:
        """A lone forward that announced its backward keeps its graph; a lone backward uses the kept graph of its inputs if
        the expert did not change since. False: compute it the ordinary way. (Batches of several
        requests recompute: one graph per request would cost a backward pass per request.)"""
        if request.kind == FORWARD:
            if not request.keep_graph:
                return False  # no backward announced: a graph would only hold memory
            request.result, graph = backend.forward_keeping_graph(request.inputs)
            with self._cond:
                self.activations.put(request.uid, graph, now=time.perf_counter())
            return True
        state = backend.state_fingerprint()
        with self._cond:
            graph = self.activations.take(request.uid, request.inputs, state, now=time.perf_counter())
        if graph is None:
            return False
        request.result = backend.backward_from_graph(graph, request.grads, defer_step=True)
        return True

    def _deliver(self, requests: list[_Request]) -> None:
        if not requests:
            return
        try:
            self._token.run_sync_soon(_wake, requests)
        except trio.RunFinishedError:
            pass  # trio is gone: nobody is waiting any more

    # --- shutdown -----------------------------------------------------------------------------------

    async def _aclose(self) -> list[BaseException]:
        """Stop the worker, fail what is still queued, save checkpoints; returns save failures."""
        with self._cond:
            self._closing = True
            stranded = [r for q in self._queues.values() for r in q.requests] + list(self._calls)
            for queue in self._queues.values():
                queue.requests.clear()
                queue.samples = 0
            self._calls.clear()
            self._queued_bytes = 0
            self._queued = 0
            self.activations.clear()
            self._cond.notify()
        for request in stranded:
            request.error = ExpertUnavailableError("the expert runtime is shutting down")
        _wake(stranded)
        if self._thread is not None:
            await trio.to_thread.run_sync(self._thread.join)
        return await trio.to_thread.run_sync(self._save_all)

    def _save_all(self) -> list[BaseException]:
        failures = []
        for backend in self.backends.values():
            if backend.checkpoint_path is not None and backend.dirty:
                try:
                    backend.save_checkpoint()
                except Exception as exc:
                    log.exception("checkpoint of expert %s failed", backend.uid)
                    failures.append(exc)
        return failures


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
