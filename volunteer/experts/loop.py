"""A trio event loop on a background thread, for code that is not async (a PyTorch training loop).

    loop = BackgroundLoop().start()
    result = loop.run(some_async_function, arg, timeout=5)   # from any ordinary thread
    loop.stop()

``run`` blocks the calling thread until the coroutine finishes in the loop's thread; exceptions
come back as they were raised. Users of ``Swarm`` never see this: RemoteExpert and
RemoteMixtureOfExperts call through it.
"""

from __future__ import annotations

import threading
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


class BackgroundLoop:
    """Owns a daemon thread running ``trio.run`` until ``stop``.

    Calls are run by worker tasks that stay alive between calls and wait, parked, for the next
    one: a call costs no task spawn, nursery or system-task wrapping, as ``trio.from_thread.run``
    does for every call (about 90 Python calls of a small remote expert call's ~2,000). Calls from
    several threads at once get a worker each."""

    def __init__(self, name: str = "volunteer-trio") -> None:
        self.name = name
        self.token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._crash: BaseException | None = None
        self._workers: trio.Nursery | None = None
        self._idle: list[trio.lowlevel.Task] = []  # workers parked until a call comes
        self._handed: dict[trio.lowlevel.Task, _Job] = {}  # the call a parked worker was woken for
        self._closing = False

    def start(self) -> "BackgroundLoop":
        if self._thread is None:
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
            self._started.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        self.token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as workers:
            self._workers = workers
            self._started.set()
            await self._stop.wait()
            self._closing = True  # calls dispatched from now on are refused, not started
            workers.cancel_scope.cancel()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.token is not None

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any, timeout: float | None = None) -> Any:
        """Run ``await fn(*args)`` in the loop; raise ExpertTimeoutError after ``timeout`` seconds."""
        token, thread = self.token, self._thread
        if token is None or thread is None or not thread.is_alive() or self._closing:
            raise VolunteerError("the background event loop is not running (call start(), or it was stopped)")
        job = _Job(fn, args, timeout)
        token.run_sync_soon(self._dispatch, job)  # RunFinishedError if the loop just ended
        while not job.done.acquire(timeout=WAKE_CHECK):
            if not thread.is_alive():  # ended before our call reached a worker
                raise trio.RunFinishedError("the background event loop stopped before the call ran")
        if job.error is not None:
            raise job.error
        return job.value

    def _dispatch(self, job: _Job) -> None:
        """On the loop's thread: hand ``job`` to a parked worker, or start one."""
        if self._closing or self._workers is None:
            job.finish(error=trio.RunFinishedError("the background event loop is stopping"))
        elif self._idle:
            worker = self._idle.pop()
            self._handed[worker] = job
            trio.lowlevel.reschedule(worker)
        else:
            self._workers.start_soon(self._work, job)

    async def _work(self, job: _Job) -> None:
        task = trio.lowlevel.current_task()

        def abort(_: object) -> trio.lowlevel.Abort:
            self._idle.remove(task)  # cancelled while parked: the loop is stopping
            return trio.lowlevel.Abort.SUCCEEDED

        while True:
            await self._perform(job)
            self._idle.append(task)
            await trio.lowlevel.wait_task_rescheduled(abort)
            job = self._handed.pop(task)

    @staticmethod
    async def _perform(job: _Job) -> None:
        try:
            if job.timeout is None:
                value = await job.fn(*job.args)
            else:
                with trio.move_on_after(job.timeout) as scope:
                    value = await job.fn(*job.args)
                if scope.cancelled_caught:
                    name = getattr(job.fn, "__name__", "call")
                    raise ExpertTimeoutError(f"{name} did not finish within {job.timeout} s")
        except trio.Cancelled:
            job.finish(error=trio.RunFinishedError("the background event loop stopped during the call"))
            raise
        except BaseException as exc:  # noqa: BLE001 - the caller gets what the call raised, as it was raised
            job.finish(error=exc)
        else:
            job.finish(value)

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
