"""The daemon's event log: a rotating file in the state dir that keeps INFO and above while the
terminal keeps what -v chose; status and doctor say where it is."""

from __future__ import annotations

import logging

from volunteer.cli.dashboard import render_text
from volunteer.cli.doctor import event_log_check
from volunteer.cli.eventlog import EVENT_LOG_BACKUPS, event_log_path, open_event_log


def test_the_event_log_keeps_notices_the_terminal_does_not_show(tmp_path):
    root = logging.getLogger("test-event-log-root")
    root.setLevel(logging.WARNING)
    root.propagate = False
    shown: list[str] = []

    class Terminal(logging.Handler):
        def emit(self, record):
            shown.append(record.getMessage())

    root.addHandler(Terminal())
    path = event_log_path(tmp_path / "state")
    handler = open_event_log(path, root)
    try:
        assert handler is not None and path == tmp_path / "state" / "logs" / "volunteer.log"
        root.info("paused (policy): outside network hours")
        root.warning("relay …abcdef stopped answering")
        root.debug("not kept")
        handler.flush()
        kept = path.read_text()
        assert "INFO" in kept and "outside network hours" in kept and "stopped answering" in kept and "not kept" not in kept
        assert shown == ["relay …abcdef stopped answering"]  # the terminal shows what it showed before
    finally:
        root.removeHandler(handler)
        handler.close()


def test_the_event_log_rotates(tmp_path, monkeypatch):
    from volunteer.cli import eventlog

    monkeypatch.setattr(eventlog, "EVENT_LOG_BYTES", 2000)
    root = logging.getLogger("test-event-log-rotation")
    root.propagate = False
    path = tmp_path / "logs" / "volunteer.log"
    handler = open_event_log(path, root)
    try:
        for i in range(200):
            root.warning("line %d of a long run %s", i, "x" * 40)
        names = sorted(p.name for p in path.parent.iterdir())
        assert names == ["volunteer.log", *(f"volunteer.log.{i}" for i in range(1, EVENT_LOG_BACKUPS + 1))]
        assert all(p.stat().st_size <= 2200 for p in path.parent.iterdir())
    finally:
        root.removeHandler(handler)
        handler.close()


def test_no_event_log_where_it_cannot_be_written_is_a_warning_not_a_failure(tmp_path, caplog):
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")
    root = logging.getLogger("test-event-log-blocked")
    assert open_event_log(event_log_path(blocker), root) is None
    assert any("no event log" in r.getMessage() for r in caplog.records)


def test_status_and_doctor_say_where_the_event_log_is(tmp_path):
    # a user's path, as long as a real one: pytest's own temporary paths (longer under
    # pytest-xdist) would not fit the status panel's column on one line
    shown = "/home/alice/.local/state/volunteer/logs/volunteer.log"
    assert f"event log {shown}" in render_text({"log_file": shown}, width=200, height=60)
    path = tmp_path / "logs" / "volunteer.log"
    assert event_log_check(path).detail.startswith("none yet") and str(path) in event_log_check(path).detail
    path.parent.mkdir()
    path.write_text("x" * 2048)
    check = event_log_check(path)
    assert check.status == "OK" and check.detail.startswith(f"{path} (2.0 KiB")


def test_the_terminal_still_shows_notices_of_loggers_set_lower_and_the_dashboard_no_info(tmp_path):
    """join without the dashboard prints the steward's notices at INFO (its logger is set to
    INFO); the event log lowering the root must not hide them, nor let every INFO line through
    the live dashboard's log handler."""
    import io

    from rich.console import Console

    from volunteer.cli.dashboard import logging_through

    root = logging.getLogger()
    before_level, before_handlers = root.level, list(root.handlers)
    out = io.StringIO()
    terminal = logging.StreamHandler(out)
    terminal.stream = out
    notices = logging.getLogger("test-event-log.notices")
    notices.setLevel(logging.INFO)
    handler = None
    try:
        root.handlers = [terminal]
        root.setLevel(logging.WARNING)
        handler = open_event_log(tmp_path / "logs" / "volunteer.log")
        logging.getLogger("test-event-log.chatter").info("a library's info line")
        notices.info("paused (policy)")
        assert "paused (policy)" in out.getvalue() and "a library's info line" not in out.getvalue()
        screen = io.StringIO()
        terminal.stream = __import__("sys").stderr  # the dashboard takes the stderr handler off
        with logging_through(Console(file=screen, width=120)):
            logging.getLogger("test-event-log.chatter").info("another info line")
        assert "another info line" not in screen.getvalue()
        handler.flush()
        assert "another info line" in (tmp_path / "logs" / "volunteer.log").read_text()  # the file keeps it
    finally:
        root.handlers = before_handlers
        root.setLevel(before_level)
        if handler is not None:
            handler.close()
