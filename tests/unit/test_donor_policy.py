"""Run-when policies as a pure core: observations and ``now`` in, a verdict out."""

from __future__ import annotations

import datetime
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from volunteer.donor.policy import (
    Observations,
    PolicyError,
    PolicySettings,
    RunPolicy,
    Window,
    settings_from,
)


def at(hour: int, minute: int = 0, day: int = 10) -> float:
    """Epoch seconds of a local time (the policy reads local time of day from ``now``)."""
    return datetime.datetime(2030, 1, day, hour, minute).timestamp()


def test_windows_parse_and_wrap_midnight():
    night = Window.parse("22:00-07:00")
    assert (night.start, night.end) == (22 * 60, 7 * 60)
    assert night.contains(23 * 60) and night.contains(3 * 60) and not night.contains(12 * 60)
    assert night.minutes_until_start(21 * 60) == 60 and night.minutes_until_start(23 * 60) == 23 * 60
    day = Window.parse(" 9:30 - 17:00 ")
    assert day.contains(9 * 60 + 30) and not day.contains(17 * 60) and str(day) == "09:30-17:00"
    assert Window.parse("00:00-24:00").contains(23 * 60 + 59)
    for bad in ("22-07", "25:00-01:00", "10:61-11:00", "10:00-10:00", "24:30-01:00", ""):
        with pytest.raises(PolicyError):
            Window.parse(bad)


@given(st.text(max_size=40))
def test_window_parse_never_crashes(text):
    try:
        window = Window.parse(text)
    except PolicyError:
        return
    assert 0 <= window.start < 24 * 60 and 0 <= window.end <= 24 * 60


def test_settings_from_checks_ranges_in_one_line():
    settings = settings_from({"on_battery": False, "when_idle": 3, "max_other_load": 25, "pause_programs": ["steam", "steam", " blender "],
                              "compute_hours": ["22:00-07:00", "12:00-13:00"], "daily_transfer": "1GiB"})
    assert settings.pause_programs == ("steam", "blender") and len(settings.compute_hours) == 2
    assert settings.daily_transfer == 2**30 and settings.idle_load == 25 and not settings.on_battery
    assert settings_from({"compute_hours": "22:00-07:00,12:00-13:00"}).compute_hours == settings.compute_hours
    assert settings_from({}).idle_load == 25.0  # BOINC's threshold when no limit is set
    for bad in ({"when_idle": -1}, {"max_other_load": 0}, {"max_other_load": 101}, {"daily_transfer": "lots"},
                {"daily_transfer": 0}, {"compute_hours": 5}, {"pause_programs": 3}, {"pause_programs": ["x" * 65]},
                {"when_idle": float("nan")}):
        with pytest.raises(PolicyError):
            settings_from(bad)


NUMBER = st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True))
SCHEMA_TYPED = st.fixed_dictionaries({}, optional={  # values of the types config.toml's schema lets through
    "on_battery": st.booleans(), "when_idle": NUMBER, "max_other_load": NUMBER,
    "pause_programs": st.lists(st.text(max_size=70), max_size=70),
    "compute_hours": st.one_of(st.text(max_size=30), st.lists(st.text(max_size=15), max_size=3)),
    "network_hours": st.text(max_size=30), "daily_transfer": st.one_of(st.integers(-10, 10**15), st.text(max_size=12)),
})


@given(SCHEMA_TYPED)
def test_settings_from_refuses_with_policy_errors_only(values):
    try:
        settings = settings_from(values)
    except PolicyError:
        return
    assert settings.when_idle >= 0 and (settings.max_other_load is None or 0 < settings.max_other_load <= 100)
    assert settings.daily_transfer is None or settings.daily_transfer > 0


def test_battery_programs_hours_transfer_in_order():
    policy = RunPolicy(settings_from({"pause_programs": ["steam"], "compute_hours": "22:00-07:00", "daily_transfer": 1000}))
    night = at(23)
    assert policy.decide(Observations(on_battery=False), night).run
    battery = policy.decide(Observations(on_battery=True, programs=frozenset({"steam"})), night)
    assert battery.text == "paused: on battery" and battery.code == "battery"
    steam = policy.decide(Observations(on_battery=False, programs=frozenset({"steam", "bash"})), night)
    assert steam.text == "paused: steam is running"
    noon = policy.decide(Observations(), at(12, 30))
    assert noon.code == "hours" and noon.until == at(22) and "resumes at 22:00" in noon.reason
    capped = policy.decide(Observations(transferred_today=1000), night)
    assert capped.code == "transfer" and capped.until == at(0, day=11) and "midnight" in capped.reason
    assert not RunPolicy(settings_from({"on_battery": False})).decide(Observations(on_battery=True), night).code


def test_network_hours_pause_too():
    verdict = RunPolicy(settings_from({"network_hours": "01:00-05:00"})).decide(Observations(), at(6))
    assert verdict.code == "network_hours" and verdict.until == at(1, day=11)


def test_other_load_pauses_and_resumes_after_calm_samples():
    policy = RunPolicy(settings_from({"max_other_load": 25}))
    now = at(12)
    assert policy.decide(Observations(other_load=10), now).run
    busy = policy.decide(Observations(other_load=80), now + 5)
    assert busy.code == "load" and busy.text == "paused: other programs use 80 % CPU (limit 25 %)"
    assert policy.decide(Observations(other_load=5), now + 10).code == "load"  # one calm sample is not enough
    assert policy.decide(Observations(other_load=5), now + 15).run
    assert policy.decide(Observations(other_load=None), now + 20).run  # unknown load changes nothing


def test_when_idle_uses_input_where_the_platform_tells():
    policy = RunPolicy(settings_from({"when_idle": 3}))
    waiting = policy.decide(Observations(input_idle_s=60), at(12))
    assert waiting.state == "waiting" and waiting.text == "waiting: computer in use, resumes after 3 idle minutes"
    assert waiting.until == at(12) + 120
    assert policy.decide(Observations(input_idle_s=180), at(12)).run


def test_when_idle_falls_back_on_other_programs_load():
    policy = RunPolicy(settings_from({"when_idle": 1}))  # no max_other_load: BOINC's 25 %
    start = at(12)
    assert policy.decide(Observations(other_load=None), start).state == "waiting"
    assert policy.decide(Observations(other_load=10), start).state == "waiting"  # calm since now
    assert policy.decide(Observations(other_load=10), start + 30).until == start + 60
    assert policy.decide(Observations(other_load=40), start + 40).state == "waiting"  # busy: starts over
    assert policy.decide(Observations(other_load=10), start + 50).state == "waiting"
    assert policy.decide(Observations(other_load=10), start + 111).run


def test_describe_lists_what_is_in_force():
    lines = settings_from({"when_idle": 0.5, "pause_programs": ["steam"], "daily_transfer": 5 * 2**30}).describe()
    assert lines[0] == "pause on battery" and any("30 s without input" in l for l in lines)
    assert "pause while steam runs" in lines and "at most 5.0 GiB transferred per day" in lines
    assert PolicySettings(on_battery=False).describe() == ["keep running on battery"]
    assert time.localtime(at(23)).tm_hour == 23


def test_another_program_on_the_gpu_pauses_and_unknown_use_never_does():
    from volunteer.donor.policy import Observations, PolicySettings, RunPolicy, settings_from

    settings = settings_from({"pause_on_gpu_use": True})
    assert settings.pause_on_gpu_use and "pause while other programs use the GPU" in settings.describe()
    policy = RunPolicy(settings)
    verdict = policy.decide(Observations(gpu_users=frozenset({"blender", "steam"})), now=0.0)
    assert (verdict.state, verdict.reason, verdict.code) == ("paused", "blender uses the GPU", "gpu")
    assert policy.decide(Observations(gpu_users=frozenset()), now=1.0).run  # nobody else on it
    assert policy.decide(Observations(gpu_users=None), now=2.0).run  # nothing tells: no pause
    off = RunPolicy(PolicySettings())
    assert off.decide(Observations(gpu_users=frozenset({"blender"})), now=0.0).run  # the policy is off by default
