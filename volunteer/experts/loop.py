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


class BackgroundLoop:
    """Owns a daemon thread running ``trio.run`` until ``stop``."""

    def __init__(self, name: str = "volunteer-trio") -> None:
        self.name = name
        self.token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._crash: BaseException | None = None

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
            self._started.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        self.token = trio.lowlevel.current_trio_token()
        self._started.set()
        await self._stop.wait()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.token is not None

    def run(self, fn: Callable[..., Awaitable[Any]], *args: Any, timeout: float | None = None) -> Any:
        """Run ``await fn(*args)`` in the loop; raise ExpertTimeoutError after ``timeout`` seconds."""
        if not self.running:
            raise VolunteerError("the background event loop is not running (call start(), or it was stopped)")

        async def bounded() -> Any:
            if timeout is None:
                return await fn(*args)
            with trio.move_on_after(timeout) as scope:
                return await fn(*args)
            if scope.cancelled_caught:
                raise ExpertTimeoutError(f"{getattr(fn, '__name__', 'call')} did not finish within {timeout} s")

        return trio.from_thread.run(bounded, trio_token=self.token)

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
