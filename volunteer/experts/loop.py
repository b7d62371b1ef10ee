"""A trio event loop on a background thread, for code that is not async (a PyTorch training loop).

    loop = BackgroundLoop().start()
    result = loop.run(some_async_function, arg, timeout=5)   # from any ordinary thread
    loop.stop()

``run`` blocks the calling thread until the coroutine finishes in the loop's thread; exceptions
come back as they were raised. Users of ``Swarm`` never see this: RemoteExpert and
RemoteMixtureOfExperts call through it.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from typing import Any, Awaitable, Callable

import trio

from ..errors import ExpertTimeoutError, VolunteerError

WAKE_CHECK = 1.0  # seconds a caller waits before it checks that the loop's thread is still alive


class _Job:
    """One ``run`` call on its way through the loop: what to await, and where its outcome goes."""

    __slots__ = ("fn", "args", "timeout", "value", "error", "done")

    def __init__(self, fn: Callable[..., Awaitable[Any]], args: tuple, timeout: float | None) -> None:
        self.fn, self.args, self.timeout = fn, args, timeout
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()  # released by the loop's thread once the call has its value or error

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.done.release()


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is trio's Cancelled, or a group of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1] is None
    return isinstance(exc, trio.Cancelled)


class BackgroundLoop:
    """Owns a daemon thread running ``trio.run`` until ``stop``.

    Calls are run by worker tasks that stay alive between calls. One of them at most, the
    listener, waits on a bell (a socket pair) that ``run`` rings after queueing its call; the bell
    wakes it and it runs the call itself, in that same loop pass, then listens again. trio's own
    ``from_thread`` and ``run_sync_soon`` wake its entry-queue task, which would then wake a
    worker: a loop pass more before every call's first byte goes out, and a task spawned per call
    on top for ``from_thread.run``. While no worker listens (the last listener runs a call), a
    call from another thread takes that slower road (``run_sync_soon``) to an idle worker or a new
    one: handing the bell on to another worker before each call would cost every call a loop pass
    of its own, on the core the called volunteer's reply wakes on. Calls from several threads at
    once get a worker each."""

    def __init__(self, name: str = "volunteer-trio") -> None:
        self.name = name
        self.token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._crash: BaseException | None = None
        self._workers: trio.Nursery | None = None
        self._jobs: deque[_Job] = deque()  # queued by callers' threads, taken by the listener
        self._bell: tuple[socket.socket, socket.socket] | None = None  # (the listener's end, callers')
        self._listener: trio.lowlevel.Task | None = None  # the worker on the bell: callers' threads read it (see run)
        self._idle: list[trio.lowlevel.Task] = []  # workers parked until handed a call
        self._handed: dict[trio.lowlevel.Task, _Job] = {}  # the call that woke a parked worker
        self._closing = False

    def start(self) -> "BackgroundLoop":
        if self._thread is None:
            self._bell = socket.socketpair()
            for end in self._bell:
                end.setblocking(False)
            self._thread = threading.Thread(target=self._thread_main, name=self.name, daemon=True)
            self._thread.start()
            self._started.wait()
            if self._crash is not None:
                raise VolunteerError(f"the background event loop failed to start: {self._crash!r}")
        return self

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # recorded for callers; a daemon thread has nobody else to tell
            self._crash = exc
        finally:
            self._closing = True
            self._refuse_queued()
            self._started.set()
            assert self._bell is not None
            for end in self._bell:
                end.close()

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with trio.open_nursery() as workers:
            self._workers = workers
            self.token = trio.lowlevel.current_trio_token()  # callers may hand calls in from now on
            workers.start_soon(self._work, None)  # the first listener
            self._started.set()
            await self._stop.wait()
            self._closing = True  # calls queued from now on are refused, not started
            workers.cancel_scope.cancel()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.token is not None

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any, timeout: float | None = None) -> Any:
        """Run ``await fn(*args)`` in the loop; raise ExpertTimeoutError after ``timeout`` seconds."""
        thread, bell = self._thread, self._bell
        if self.token is None or thread is None or bell is None or not thread.is_alive() or self._closing:
            raise VolunteerError("the background event loop is not running (call start(), or it was stopped)")
        job = _Job(fn, args, timeout)
        self._jobs.append(job)
        # Queued first, then the listener read; a worker becomes the listener, then reads the
        # queue, and stops being it before taking the queue: a call it misses was queued after it
        # stopped listening, and takes the other road.
        try:
            if self._listener is not None:
                bell[1].send(b"\0")
            else:
                self.token.run_sync_soon(self._take_queued)
        except BlockingIOError:
            pass  # rings nobody has read yet: the listener wakes all the same, and takes every call
        except (OSError, trio.RunFinishedError):
            raise trio.RunFinishedError("the background event loop stopped before the call ran") from None
        while not job.done.acquire(timeout=WAKE_CHECK):
            if not thread.is_alive():  # ended before our call reached a worker
                raise trio.RunFinishedError("the background event loop stopped before the call ran")
        if job.error is not None:
            raise job.error
        return job.value

    def _refuse_queued(self) -> None:
        """Fail the calls nobody will take (the loop is ending)."""
        while self._jobs:
            self._jobs.popleft().finish(error=trio.RunFinishedError("the background event loop is stopping"))

    async def _work(self, job: _Job | None) -> None:
        task = trio.lowlevel.current_task()
        while True:
            if job is None:
                listens = self._claim_bell(task)
            else:
                value, error = await self._perform(job)
                # Claimed before the caller wakes: its next call (a backward after its forward)
                # then rings the bell instead of taking the slower road.
                listens = self._claim_bell(task)
                job.finish(value, error)
            job = await (self._listen() if listens else self._park(task))

    def _claim_bell(self, task: trio.lowlevel.Task) -> bool:
        """Make ``task`` the listener if nobody listens; whether it did."""
        if self._listener is not None:
            return False
        self._listener = task
        return True

    async def _park(self, task: trio.lowlevel.Task) -> _Job:
        """Wait until handed a call (``_take_queued``)."""
        def abort(_: object) -> trio.lowlevel.Abort:
            self._idle.remove(task)  # cancelled while parked: the loop is stopping
            return trio.lowlevel.Abort.SUCCEEDED

        self._idle.append(task)
        await trio.lowlevel.wait_task_rescheduled(abort)
        return self._handed.pop(task)

    async def _listen(self) -> _Job:
        """As the listener: wait for the bell, take the calls queued by then, stop listening, run
        the first (handing the others out). The bell is emptied before the queue is read: a call
        queued after that rings it again, so none waits for the next one's ring."""
        assert self._bell is not None
        bell = self._bell[0]
        try:
            while True:
                try:
                    bell.recv(4096)  # one read: rings left over (more than 4096) wake the next wait at once
                except BlockingIOError:
                    pass
                if self._jobs:
                    self._listener = None  # before the queue is read: see run
                    jobs = self._queued()
                    break
                await trio.lowlevel.wait_readable(bell)
        finally:
            self._listener = None
        for extra in jobs[1:]:
            self._hand(extra)
        return jobs[0]

    def _queued(self) -> list[_Job]:
        jobs = [self._jobs.popleft()]
        while self._jobs:
            jobs.append(self._jobs.popleft())
        return jobs

    def _take_queued(self) -> None:
        """Hand the calls queued while nobody listened to idle workers or new ones (on the loop's
        thread, from ``run_sync_soon``); the listener may have taken them already."""
        if self._closing:
            self._refuse_queued()
        elif self._jobs:
            for job in self._queued():
                self._hand(job)

    def _hand(self, job: _Job) -> None:
        """Give ``job`` to a parked worker, or to a new one."""
        if self._idle:
            worker = self._idle.pop()
            self._handed[worker] = job
            trio.lowlevel.reschedule(worker)
        else:
            assert self._workers is not None
            self._workers.start_soon(self._work, job)

    @staticmethod
    async def _perform(job: _Job) -> tuple[Any, BaseException | None]:
        """The call's value or error, for the caller; if the loop stops meanwhile, the caller is
        told so and the cancellation goes on."""
        try:
            if job.timeout is None:
                return await job.fn(*job.args), None
            with trio.move_on_after(job.timeout) as scope:
                value = await job.fn(*job.args)
            if scope.cancelled_caught:
                name = getattr(job.fn, "__name__", "call")
                raise ExpertTimeoutError(f"{name} did not finish within {job.timeout} s")
            return value, None
        except BaseException as exc:  # noqa: BLE001 - the caller gets what the call raised, as it was raised
            if _cancelled(exc):  # the loop is stopping: bare, or as a group from a nursery in the call
                job.finish(error=trio.RunFinishedError("the background event loop stopped during the call"))
                raise
            return None, exc

    def stop(self) -> None:
        """End the loop (idempotent); tasks still running in it are cancelled."""
        if self.running and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
            except trio.RunFinishedError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __enter__(self) -> "BackgroundLoop":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["BackgroundLoop"]
