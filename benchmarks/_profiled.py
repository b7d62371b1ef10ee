"""Run ``python -m MODULE ARGS...`` under cProfile and write the profile when it is told to stop.

    python benchmarks/_profiled.py OUT.prof MODULE [ARGS...]

For a benchmark's server process that is ended by a signal (the NAT rig sends SIGTERM): the
profile is written on SIGTERM or SIGINT as well as on a normal exit.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys


def main() -> None:
    out, module, *args = sys.argv[1:]
    profile = cProfile.Profile()

    def stop(signum, frame) -> None:
        profile.disable()
        profile.dump_stats(out)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    sys.argv = [module, *args]
    sys.path[0] = os.getcwd()  # as ``python -m`` has it: the checkout's packages, not an installed copy
    profile.enable()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
