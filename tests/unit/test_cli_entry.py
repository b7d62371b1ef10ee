"""The CLI's entry point: a Ctrl-C that Python swallowed in a finalizer still ends the command."""

from __future__ import annotations

import sys
import time

import pytest

from volunteer.cli.entry import _raise_swallowed_interrupts


class _InterruptedWhileCollected:
    """What an import lock's weakref callback did when the Ctrl-C landed in it (seen in CI: the
    interrupt was printed as "Exception ignored" and ``join`` ran on)."""

    def __del__(self) -> None:
        raise KeyboardInterrupt


@pytest.fixture
def passed_on():
    """The entry point's hook installed over one that keeps what it is handed (the list)."""
    others: list = []
    previous = sys.unraisablehook
    sys.unraisablehook = _raise_swallowed_interrupts(others.append)
    try:
        yield others
    finally:
        sys.unraisablehook = previous


def test_a_ctrl_c_swallowed_by_a_finalizer_is_raised_again_in_the_main_thread(passed_on) -> None:
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _InterruptedWhileCollected()  # collected at once: its __del__ raises, Python swallows it
        while time.monotonic() - started < 10:  # the main thread runs on; the interrupt comes back
            pass
    assert passed_on == []  # not printed as "Exception ignored"


def test_other_unraisable_exceptions_go_to_the_previous_hook(passed_on) -> None:
    class Broken:
        def __del__(self) -> None:
            raise ValueError("in a finalizer")

    Broken()
    assert len(passed_on) == 1 and isinstance(passed_on[0].exc_value, ValueError)
