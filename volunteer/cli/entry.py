"""The ``volunteer`` command's entry point, kept light: a Ctrl-C that comes while the command's
modules are still importing ends it with status 130, as one later does, never a traceback."""

from __future__ import annotations

import sys


def run() -> None:
    """Run ``volunteer`` with ``sys.argv`` and exit with its status."""
    try:
        from .main import main

        code = main()
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


__all__ = ["run"]
