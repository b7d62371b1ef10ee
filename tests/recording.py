"""What tests count a call's cost in: a pass-through stream that keeps every write (the socket
writes a call costs), and an instrument that counts a task's steps (its passes through the
scheduler)."""

from __future__ import annotations

import trio


class RecordingStream(trio.abc.HalfCloseableStream):
    """Passes everything through to ``inner`` and keeps each write in ``writes``."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    async def send_all(self, data) -> None:
        self.writes.append(bytes(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None):
        return await self.inner.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


class TaskSteps(trio.abc.Instrument):
    """Counts the steps ``task`` is scheduled for: one more each time it yields (add it with
    ``trio.lowlevel.add_instrument``)."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task, self.steps = task, 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += task is self.task
