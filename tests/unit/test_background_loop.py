"""BackgroundLoop's hand-offs: a call from another thread is heard while one runs, a lone
caller's call costs the loop one pass, calls from many threads at once all arrive, a call cut off
by stop() says so however its coroutine raised the cancellation, and no bell is left open."""

from __future__ import annotations

import random
import threading

import pytest
import trio

from volunteer.experts.loop import BackgroundLoop


def test_a_call_is_heard_while_another_one_waits_in_the_loop() -> None:
    """The worker the bell woke runs its call; a call from another thread meanwhile reaches
    another worker. Without that, the second call would wait for the first, which waits for the
    second: both time out."""
    with BackgroundLoop() as loop:
        opened = trio.Event()  # created and set on the loop's thread only
        waiting = threading.Event()

        async def wait_open() -> str:
            waiting.set()
            with trio.fail_after(5):
                await opened.wait()
            return "opened"

        async def open_it() -> str:
            opened.set()
            return "set"

        answers: list[str] = []
        first = threading.Thread(target=lambda: answers.append(loop.run(wait_open)))
        first.start()
        assert waiting.wait(5)
        assert loop.run(open_it, timeout=5) == "set"
        first.join(5)
        assert answers == ["opened"]
        # calls one after another reuse the workers they woke: no task left behind per call
        for _ in range(20):
            loop.run(trio.sleep, 0)
        assert loop._workers is not None and len(loop._workers.child_tasks) <= 3


class _StepCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


def test_a_lone_callers_call_costs_the_loop_one_task_step() -> None:
    """The bell wakes the listener, which runs the call and listens again: no other worker is
    woken to listen meanwhile (a loop pass more per call, on the core the reply wakes on)."""
    async def nothing() -> int:
        return 1

    with BackgroundLoop() as loop:
        for _ in range(5):
            loop.run(nothing)
        counter = _StepCounter()
        loop.run(_add_instrument, counter)
        for _ in range(50):
            assert loop.run(nothing) == 1
        loop.run(_remove_instrument, counter)
        # 50 calls, plus the two that installed and removed the counter
        assert counter.steps <= 52, counter.steps


async def _add_instrument(instrument: trio.abc.Instrument) -> None:
    trio.lowlevel.add_instrument(instrument)


async def _remove_instrument(instrument: trio.abc.Instrument) -> None:
    trio.lowlevel.remove_instrument(instrument)


def test_calls_from_many_threads_at_once_all_arrive() -> None:
    """Eight threads call at once, with calls that finish at once and calls that wait in the
    loop: each call is queued while a worker listens, or while none does (all run calls), and
    every one gets its own answer; the workers stay as many as the calls at once."""
    threads, calls = 8, 150
    answers: dict[int, list[int]] = {n: [] for n in range(threads)}

    async def echo(value: int, pause: float) -> int:
        if pause:
            await trio.sleep(pause)
        return value

    def caller(n: int) -> None:
        rng = random.Random(n)
        for i in range(calls):
            answers[n].append(loop.run(echo, n * calls + i, rng.choice([0, 0, 0.0005]), timeout=10))

    with BackgroundLoop() as loop:
        workers = [threading.Thread(target=caller, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert not any(worker.is_alive() for worker in workers)
        assert all(answers[n] == [n * calls + i for i in range(calls)] for n in range(threads))
        assert loop._workers is not None and len(loop._workers.child_tasks) <= threads + 1


def test_a_call_cut_off_by_stop_raises_run_finished_even_from_inside_a_nursery() -> None:
    """A nursery in the call wraps the cancellation in an ExceptionGroup; the caller still hears
    that the loop stopped, not the group."""
    loop = BackgroundLoop().start()
    started = threading.Event()

    async def nursery_forever() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            started.set()
            await trio.sleep_forever()

    raised: list[BaseException] = []

    def call() -> None:
        try:
            loop.run(nursery_forever)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            raised.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert started.wait(5)
    loop.stop()
    caller.join(5)
    assert len(raised) == 1 and isinstance(raised[0], trio.RunFinishedError), raised
    assert loop._bell is not None and all(end.fileno() == -1 for end in loop._bell)  # closed
    with pytest.raises(Exception, match="not running"):
        loop.run(trio.sleep, 0)
