"""BackgroundLoop's hand-offs: a call from another thread is heard while one runs, a call cut off
by stop() says so however its coroutine raised the cancellation, and no bell is left open."""

from __future__ import annotations

import threading

import pytest
import trio

from volunteer.experts.loop import BackgroundLoop


def test_a_call_is_heard_while_another_one_waits_in_the_loop() -> None:
    """The worker the bell woke runs its call; another listens meanwhile. Without that, the
    second call would wait for the first, which waits for the second: both time out."""
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
