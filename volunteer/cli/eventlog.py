"""The daemon's event log: a rotating file in the state dir, as BOINC keeps its event log.

The terminal (or the journal) shows warnings, and the dashboard's Log panel the last few; what
the daemon did over days (each fold and pause, hand-offs, relays lost and found, problems) is
kept at INFO in ``<state dir>/logs/volunteer.log``, rotated at ``EVENT_LOG_BYTES`` with
``EVENT_LOG_BACKUPS`` older files. ``volunteer status`` and ``volunteer doctor`` say where it is.
"""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

EVENT_LOG_BYTES = 1 << 20  # one file's size before it rotates
EVENT_LOG_BACKUPS = 3  # older files kept: volunteer.log.1 .. .3
EVENT_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

log = logging.getLogger(__name__)


def event_log_path(state_dir: Path) -> Path:
    """Where the event log of the daemons run with this state dir goes."""
    return state_dir / "logs" / "volunteer.log"


def open_event_log(path: Path, root: logging.Logger | None = None) -> logging.Handler | None:
    """Keep INFO and above of ``root`` (the root logger) in a rotating file at ``path``; the
    handlers already there keep the level they showed (``-v`` decides the terminal, not the
    file). None, with a warning, when the file cannot be opened: the daemon runs on without it."""
    root = root if root is not None else logging.getLogger()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=EVENT_LOG_BYTES, backupCount=EVENT_LOG_BACKUPS,
                                                       encoding="utf-8")
    except OSError as exc:
        log.warning("no event log: cannot write %s (%s)", path, exc.strerror or exc)
        return None
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(EVENT_LOG_FORMAT))
    if root.getEffectiveLevel() > logging.INFO:
        for existing in root.handlers:
            if existing.level == logging.NOTSET:
                existing.setLevel(root.getEffectiveLevel())
        root.setLevel(logging.INFO)
    root.addHandler(handler)
    return handler


__all__ = ["EVENT_LOG_BACKUPS", "EVENT_LOG_BYTES", "event_log_path", "open_event_log"]
