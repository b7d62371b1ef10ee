"""SendLock: an uncontended acquire does not pass through the scheduler; a cancelled one raises
before the lock is taken; contended writers get it in FIFO order."""

from __future__ import annotations

import pytest
import trio

from volunteer.net.sendlock import SendLock


async def test_an_uncontended_acquire_does_not_yield():
    lock = SendLock()
    ran = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _mark(ran))
        async with lock:
            assert lock.locked() and ran == []  # the other task did not get to run
        await trio.sleep(0)
    assert ran == [True] and not lock.locked()


async def _mark(ran: list) -> None:
    ran.append(True)


async def test_a_cancelled_acquire_raises_and_leaves_the_lock_free():
    lock = SendLock()
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            async with lock:
                pytest.fail("entered a lock while cancelled")
    assert not lock.locked()


async def test_contended_writers_take_turns_in_arrival_order():
    lock = SendLock()
    order = []

    async def writer(name: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with lock:
            order.append(name)
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        async with lock:
            for name in "abc":
                await nursery.start(writer, name)
                await trio.sleep(0)  # each parks on the lock before the next arrives
        # released: a, b, c in the order they queued
    assert order == ["a", "b", "c"]


async def test_a_waiter_cancelled_in_the_queue_neither_takes_nor_keeps_the_lock():
    lock = SendLock()
    got = []

    async def waiter(name: str, scope: trio.CancelScope, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            task_status.started()
            async with lock:
                got.append(name)

    async with trio.open_nursery() as nursery:
        first, second = trio.CancelScope(), trio.CancelScope()
        async with lock:
            await nursery.start(waiter, "first", first)
            await nursery.start(waiter, "second", second)
            await trio.sleep(0)  # both parked
            first.cancel()  # aborted in the queue; it resumes only after our release
        await trio.sleep(0.01)
        assert got == ["second"]
        second.cancel()
        # the cancelled one was counted as waiting when we released: the lock went to the
        # second, then came free; it is not held by nobody
        assert not lock.locked()

    async with trio.open_nursery() as nursery:
        only = trio.CancelScope()
        async with lock:
            await nursery.start(waiter, "only", only)
            await trio.sleep(0)
            only.cancel()  # its abort left the lot empty while it still counts as waiting
        assert not lock.locked()  # released to nobody: free, not held forever
    async with lock:
        got.append("after")
    assert got == ["second", "after"]
