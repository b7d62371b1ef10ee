"""The contribution history: hours, days and months, bounded, kept across restarts."""

from __future__ import annotations

import datetime
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volunteer.donor.history import DAYS_KEPT, HOURS_KEPT, MAX_GAP, Deltas, History, load, load_all, save, history_path


def at(day: int, hour: int = 12, month: int = 3) -> float:
    return datetime.datetime(2030, month, day, hour).timestamp()


def test_figures_land_in_their_hour_day_and_month():
    history = History()
    history.add(at(1, 10), {"calls": 3, "gpu_s": 1.5})
    history.add(at(1, 11), {"calls": 2, "cpu_s": 0.5})
    history.served(at(1, 11), "trainer-a")
    history.served(at(1, 11), "trainer-a")
    history.served(at(2, 9), "trainer-b")
    assert history.days["2030-03-01"].calls == 5 and history.days["2030-03-01"].trainers.count() == 1
    assert history.months["2030-03"].calls == 5 and history.months["2030-03"].trainers.count() == 2
    hours = dict(history.hourly(at(1, 11), 2))
    assert [b.calls for b in hours.values()] == [3, 2]
    days = history.daily(at(3), 3)
    assert [d for d, _ in days] == ["2030-03-01", "2030-03-02", "2030-03-03"] and days[0][1].gpu_s == 1.5


def test_uptime_counts_gaps_up_to_a_limit_and_serving_apart():
    history = History()
    history.tick(at(1), serving=True)
    history.tick(at(1) + 30, serving=True)
    history.tick(at(1) + 60, serving=False)
    history.tick(at(1) + 3600, serving=True)  # the laptop slept
    day = history.days["2030-03-01"]
    assert day.uptime_s == 60 + MAX_GAP and day.serving_s == 30 + MAX_GAP


def test_deltas_survive_counter_restarts():
    deltas = Deltas()
    assert deltas.step({"calls a": 5}) == {"calls a": 5}
    assert deltas.step({"calls a": 7, "calls b": 1}) == {"calls a": 2, "calls b": 1}
    assert deltas.step({"calls a": 3}) == {"calls a": 3}  # a went away and came back: counts anew


def test_old_buckets_roll_off():
    history = History()
    start = at(1, 0, month=1)
    for hour in range(24 * 500):
        history.add(start + hour * 3600, {"calls": 1})
    assert len(history.hours) == HOURS_KEPT and len(history.days) == DAYS_KEPT
    assert sum(b.calls for b in history.months.values()) == 24 * 500  # months keep the whole story


def test_kept_across_restarts_and_merged_across_swarms(tmp_path):
    first = History()
    first.add(at(1), {"calls": 4, "bytes_sent": 100})
    first.served(at(1), "t")
    assert save(history_path(tmp_path, "swarm/a"), first)
    second = History()
    second.add(at(1), {"calls": 1})
    second.add(at(5), {"calls": 2})
    save(history_path(tmp_path, "b"), second)
    again = load(history_path(tmp_path, "swarm/a"))
    assert again.days["2030-03-01"].calls == 4 and again.days["2030-03-01"].trainers.count() == 1
    both = load_all(tmp_path)
    assert both.days["2030-03-01"].calls == 5 and both.days["2030-03-05"].calls == 2
    assert load_all(tmp_path, "b").days["2030-03-01"].calls == 1
    path = history_path(tmp_path, "broken")
    path.write_text("{not json")
    assert load(path).days == {}  # a broken file starts afresh (with a warning) instead of stopping join


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_a_corrupt_history_is_kept_aside_and_said_once_never_replaced_silently(tmp_path, caplog, content):
    path = history_path(tmp_path, "swarm")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert load_all(tmp_path, "swarm").days == {} and path.read_bytes() == content  # a reader leaves it be
    caplog.clear()
    history = load(path, now=at(1))
    assert history.days == {} and not path.exists()
    aside = [p for p in path.parent.iterdir() if p.name.startswith("swarm.json.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == content  # what it held is still there
    said = [r for r in caplog.records if "corrupt" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING" and aside[0].name in said[0].getMessage()
    history.add(at(1), {"calls": 3})
    assert save(path, history) and load(path).days["2030-03-01"].calls == 3
    assert aside[0].read_bytes() == content


def test_a_history_that_cannot_be_read_is_not_saved_over(tmp_path, monkeypatch):
    path = history_path(tmp_path, "swarm")
    first = History()
    first.add(at(1), {"calls": 7})
    assert save(path, first)

    def refuse(self, *args, **kwargs):
        raise PermissionError("denied")

    monkeypatch.setattr(type(path), "read_text", refuse)
    later = load(path)
    monkeypatch.undo()
    later.add(at(2), {"calls": 1})
    assert not save(path, later)  # the caller warns once; the kept file is not lost
    assert load(path).days["2030-03-01"].calls == 7


@settings(max_examples=200)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
                    max_leaves=30))
def test_any_json_loads_into_a_bounded_history(data):
    history = History.from_json(data)
    assert len(history.hours) <= HOURS_KEPT and len(history.days) <= DAYS_KEPT
    json.dumps(history.to_json())


def test_buckets_with_bad_figures_count_zero():
    history = History.from_json({"days": {"2030-03-01": {"calls": -5, "samples": "x", "gpu_s": float("nan"), "cpu_s": 2,
                                                         "trainers": ["zz", 5, "00000000000000ff"]}, "bogus": {}}})
    day = history.days["2030-03-01"]
    assert (day.calls, day.samples, day.cpu_s, day.trainers.count()) == (0, 0, 2.0, 2)
    assert list(history.days) == ["2030-03-01"]
