"""Expert failures logged in a burst become one warning with the count of the others."""

from __future__ import annotations

import logging

from volunteer.cli.logburst import BurstFilter


def failure(uid: str, at: float) -> logging.LogRecord:
    record = logging.LogRecord("volunteer.experts.server", logging.WARNING, __file__, 1,
                               "expert %s failed for %s: %s", (uid, "…abc", "RuntimeError: boom"), None)
    record.created = at
    return record


def test_a_burst_of_failures_is_one_warning_then_a_count():
    burst = BurstFilter(window=10.0)
    shown = [r for r in (failure(f"expert.0.{i % 4}", 100.0 + i * 0.2) for i in range(16)) if burst.filter(r)]
    assert len(shown) == 1  # 16 failures in 3 s: one line
    later = failure("expert.0.1", 120.0)
    assert burst.filter(later)
    message = later.getMessage()
    assert message.startswith("expert expert.0.1 failed for …abc: RuntimeError: boom; 15 more expert failure(s)")
    assert "expert.0.1 ×4" in message and message.endswith(", …)")  # the three most failing, by expert
    again = failure("expert.0.2", 135.0)
    assert burst.filter(again) and "more" not in again.getMessage()  # nothing held back since


def test_other_records_pass_untouched():
    burst = BurstFilter()
    burst.filter(failure("expert.0.0", 1.0))
    other = logging.LogRecord("volunteer.experts.server", logging.WARNING, __file__, 1, "relay went away", (), None)
    other.created = 1.1
    assert burst.filter(other) and other.getMessage() == "relay went away"
