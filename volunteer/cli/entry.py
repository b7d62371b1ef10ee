"""The ``volunteer`` command's entry point, kept light: a Ctrl-C that comes while the command's
modules are still importing ends it with status 130, as one later does, never a traceback.

Python raises a Ctrl-C's KeyboardInterrupt wherever the main thread is, and one raised inside a
finalizer (an import lock's weakref callback, a ``__del__``) is not raised at all: Python prints
"Exception ignored in ..." with a traceback, and the command carries on as if no key was pressed
(a ``join`` then runs until the next Ctrl-C, as one did in CI). Such an interrupt is raised
again a moment later, where it can end the command."""

from __future__ import annotations

import _thread
import sys
import time

HAND_BACK_DELAY = 0.01  # seconds: by then the main thread has left the hook that sent it


def _interrupt_main_soon() -> None:
    time.sleep(HAND_BACK_DELAY)
    _thread.interrupt_main()


def _raise_swallowed_interrupts(previous):
    """An ``unraisablehook`` that hands a swallowed KeyboardInterrupt back to the main thread and
    passes everything else to ``previous``. The hand-back comes from a bare thread a moment
    later: raised now, the interrupt would land in this hook and be swallowed again (a
    ``threading.Thread`` would even wait here for its start). Should it land in another
    finalizer, this hook sends it once more."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _thread.start_new_thread(_interrupt_main_soon, ())
            return
        previous(unraisable)

    return hook


def run() -> None:
    """Run ``volunteer`` with ``sys.argv`` and exit with its status."""
    sys.unraisablehook = _raise_swallowed_interrupts(sys.unraisablehook)
    try:
        from .main import main

        code = main()
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


__all__ = ["run"]
