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
