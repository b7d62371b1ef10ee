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


class AsBefore(logging.Filter):
    """What a terminal handler showed before the root logger went down to INFO for the file:
    records at the old root ``level``, and those of loggers set lower on purpose (the steward's
    notices, which ``join`` without the dashboard prints at INFO)."""

    def __init__(self, level: int, root: logging.Logger) -> None:
        super().__init__()
        self.level = level
        self.root = root  # the logger whose level went down: its own level no longer says what to show

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self.level:
            return True
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None and logger.level == logging.NOTSET:
            logger = logger.parent
        return logger is not None and logger is not self.root and record.levelno >= logger.level


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
            existing.addFilter(AsBefore(root.getEffectiveLevel(), root))
        root.setLevel(logging.INFO)
    root.addHandler(handler)
    return handler


__all__ = ["EVENT_LOG_BACKUPS", "EVENT_LOG_BYTES", "AsBefore", "event_log_path", "open_event_log"]
