"""Run-when policies: when a donor's machine computes for the swarm, as a pure core.

The models are BOINC's computing preferences (suspend while the computer is in use and resume
after 3 idle minutes, suspend on battery, suspend while other programs use more than 25 % CPU,
time-of-day windows for computing and for the network, a daily transfer cap, an exclusive
application list) and Folding@home's ``on_battery`` / ``on_idle``.

``RunPolicy`` takes what the machine looks like now (``Observations``: battery, other programs'
load, process names, input idleness, bytes moved today) and ``now`` (wall-clock seconds; local
time of day comes from it), and returns a ``Verdict``: run, paused with a reason, or waiting
with the time it resumes. It never reads a clock, a file or a process table itself: the
``PolicyService`` in ``volunteer/cli/policyservice.py`` samples ``volunteer/cli/probes.py`` and
applies the verdict. A donor's settings are ``PolicySettings``, from config.toml's ``[run]``
table and ``volunteer join``'s flags (``settings_from``).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field, replace

from ..errors import VolunteerError
from ..sizes import format_size
from .status import PolicySettingsView, VerdictView

DEFAULT_IDLE_LOAD = 25.0  # % of the machine: BOINC's "in use" threshold for other programs' CPU
LOAD_RESUME_SAMPLES = 2  # samples below the load limit before a load pause lifts (no flapping)
PROGRAM_NAME_LIMIT = 64  # names of programs to pause for, each at most this long
MAX_PROGRAMS = 64
MINUTES_PER_DAY = 24 * 60
GPU_USE_LINE = "pause while other programs use the GPU"
GPU_USE_UNKNOWN = "unavailable here: no NVML or nvidia-smi tells which programs use the GPU"


class PolicyError(VolunteerError):
    """A run-when setting that does not parse (a bad time window, a negative minute count)."""


# --- time-of-day windows --------------------------------------------------------------------------

_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


@dataclass(frozen=True)
class Window:
    """A daily time window in local time, ``start`` to ``end`` in minutes after midnight; one
    whose end is before its start runs over midnight (22:00-07:00)."""

    start: int
    end: int

    @classmethod
    def parse(cls, text: str) -> "Window":
        """``"22:00-07:00"`` → Window; PolicyError saying what a window looks like otherwise."""
        match = _WINDOW.match(str(text))
        if not match:
            raise PolicyError(f"time window {str(text)[:40]!r} is not HH:MM-HH:MM (e.g. 22:00-07:00)")
        h1, m1, h2, m2 = (int(g) for g in match.groups())
        if h1 > 24 or h2 > 24 or m1 > 59 or m2 > 59 or (h1 == 24 and m1) or (h2 == 24 and m2):
            raise PolicyError(f"time window {text!r} has a time that does not exist (hours 0-24, minutes 0-59)")
        start, end = h1 * 60 + m1, h2 * 60 + m2
        if start == end:
            raise PolicyError(f"time window {text!r} is empty: its start and end are the same time")
        return cls(start % MINUTES_PER_DAY, end if end <= MINUTES_PER_DAY else end % MINUTES_PER_DAY)

    def contains(self, minute: float) -> bool:
        """Whether ``minute`` (after local midnight) falls inside the window."""
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end

    def minutes_until_start(self, minute: float) -> float:
        """Minutes from ``minute`` to the window's next opening."""
        return (self.start - minute) % MINUTES_PER_DAY

    def __str__(self) -> str:
        return f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"


def _local_minute(now: float) -> float:
    local = time.localtime(now)
    return local.tm_hour * 60 + local.tm_min + (now % 60) / 60


def _next_local_midnight(now: float) -> float:
    local = time.localtime(now)
    seconds_into_day = local.tm_hour * 3600 + local.tm_min * 60 + local.tm_sec + (now % 1)
    return now - seconds_into_day + 86400


def local_day(now: float) -> str:
    """The local date of ``now`` as ``YYYY-MM-DD`` (the daily transfer cap counts per such day)."""
    return time.strftime("%Y-%m-%d", time.localtime(now))


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M", time.localtime(epoch))


# --- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicySettings:
    """A donor's run-when settings (config.toml ``[run]``, ``volunteer join`` flags)."""

    on_battery: bool = True  # pause while the machine runs on battery
    when_idle: float = 0.0  # minutes without input (or with low load) before computing; 0: off
    max_other_load: float | None = None  # pause while other programs use more than this % of the CPU
    pause_programs: tuple[str, ...] = ()  # pause while any of these programs runs
    compute_hours: tuple[Window, ...] = ()  # compute only inside these daily windows (none: always)
    network_hours: tuple[Window, ...] = ()  # use the network only inside these windows (none: always)
    daily_transfer: int | None = None  # bytes in and out per local day, then pause until midnight
    pause_on_gpu_use: bool = False  # pause while another program uses a GPU (where the driver tells)

    @property
    def idle_load(self) -> float:
        """Other programs' load (%) under which the machine counts as idle when the platform does
        not say how long since the last input."""
        return self.max_other_load if self.max_other_load is not None else DEFAULT_IDLE_LOAD

    def describe(self) -> list[str]:
        """One short line per policy in force, for the dashboard, the web page and consent."""
        lines = ["pause on battery" if self.on_battery else "keep running on battery"]
        if self.when_idle:
            lines.append(f"only when idle: after {_minutes(self.when_idle)} without input "
                         f"(or with other programs under {self.idle_load:g} % CPU)")
        if self.max_other_load is not None:
            lines.append(f"pause while other programs use more than {self.max_other_load:g} % CPU")
        if self.pause_programs:
            lines.append("pause while " + ", ".join(self.pause_programs) + " runs")
        if self.pause_on_gpu_use:
            lines.append(GPU_USE_LINE)
        if self.compute_hours:
            lines.append("compute only " + ", ".join(str(w) for w in self.compute_hours))
        if self.network_hours:
            lines.append("network only " + ", ".join(str(w) for w in self.network_hours))
        if self.daily_transfer:
            lines.append(f"at most {format_size(self.daily_transfer)} transferred per day")
        return lines

    def as_dict(self) -> PolicySettingsView:
        """The settings as JSON (the status snapshot's ``policy.settings``)."""
        return PolicySettingsView(
            on_battery=self.on_battery, when_idle=self.when_idle, max_other_load=self.max_other_load,
            pause_programs=list(self.pause_programs), compute_hours=[str(w) for w in self.compute_hours],
            network_hours=[str(w) for w in self.network_hours], daily_transfer=self.daily_transfer,
            pause_on_gpu_use=self.pause_on_gpu_use,
        )


def _minutes(value: float) -> str:
    if value < 1:
        return f"{value * 60:g} s"
    return f"{value:g} idle minute" + ("" if value == 1 else "s")


def _windows(value: object, key: str) -> tuple[Window, ...]:
    items = [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
    if items is None:
        raise PolicyError(f"{key} must be a window or a list of windows like \"22:00-07:00\"")
    windows = []
    for item in items:
        for part in str(item).split(","):
            if part.strip():
                windows.append(Window.parse(part))
    return tuple(windows)


def _programs(value: object) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else None
    if items is None:
        raise PolicyError("pause_programs must be a list of program names, e.g. [\"steam\", \"blender\"]")
    names = tuple(dict.fromkeys(str(n).strip() for n in items if str(n).strip()))
    if len(names) > MAX_PROGRAMS or any(len(n) > PROGRAM_NAME_LIMIT for n in names):
        raise PolicyError(f"pause_programs takes at most {MAX_PROGRAMS} names of at most {PROGRAM_NAME_LIMIT} characters")
    return names


def settings_from(values: dict) -> PolicySettings:
    """PolicySettings from ``[run]``-style keys (flags already merged over the file's values);
    PolicyError in one line for a value out of range."""
    from ..sizes import parse_size

    settings = PolicySettings()
    changes: dict = {}
    if "on_battery" in values:
        changes["on_battery"] = bool(values["on_battery"])
    if values.get("pause_on_gpu_use"):
        changes["pause_on_gpu_use"] = True
    if values.get("when_idle") is not None:
        minutes = float(values["when_idle"])
        if not math.isfinite(minutes) or minutes < 0 or minutes > MINUTES_PER_DAY:
            raise PolicyError("when_idle is minutes without input before computing: 0 (off) to 1440")
        changes["when_idle"] = minutes
    if values.get("max_other_load") is not None:
        load = float(values["max_other_load"])
        if not 0 < load <= 100:
            raise PolicyError("max_other_load is a percentage of the CPU: more than 0, at most 100")
        changes["max_other_load"] = load
    if values.get("pause_programs"):
        changes["pause_programs"] = _programs(values["pause_programs"])
    for key in ("compute_hours", "network_hours"):
        if values.get(key):
            changes[key] = _windows(values[key], key)
    if values.get("daily_transfer") is not None:
        raw = values["daily_transfer"]
        try:
            cap = parse_size(raw) if isinstance(raw, str) else int(raw)
        except ValueError as exc:
            raise PolicyError(f"daily_transfer: {exc} (e.g. 10GiB)") from None
        if cap <= 0:
            raise PolicyError("daily_transfer must be more than 0 bytes (leave it out for no cap)")
        changes["daily_transfer"] = cap
    return replace(settings, **changes)


# --- observations and verdicts --------------------------------------------------------------------


@dataclass(frozen=True)
class Observations:
    """What the machine looks like at one sample (``probes.py`` measures it).

    ``None`` means "this platform does not tell": no battery sensor, no input-idle source."""

    on_battery: bool | None = None
    other_load: float | None = None  # % of the machine other programs used since the last sample
    programs: frozenset[str] = frozenset()  # names of running programs (lower case)
    input_idle_s: float | None = None  # seconds since the last keyboard or mouse input
    transferred_today: int = 0  # bytes in and out since local midnight
    # bytes the last sample period's rate moves before the next sample: the cap pauses when that
    # would cross it, so the donor's cap is not overshot by a period of traffic before the pause
    transfer_ahead: int = 0
    gpu_users: frozenset[str] | None = None  # other programs using a GPU (None: nothing tells)


@dataclass(frozen=True)
class Verdict:
    """What the policy says now: ``state`` is ``running``, ``paused`` or ``waiting``; ``code``
    names the policy that decided (``battery``, ``program``, ``gpu``, ``idle``, ``load``, ``hours``,
    ``network_hours``, ``transfer``); ``until`` is when it lifts, if known (wall clock)."""

    state: str = "running"
    reason: str = ""
    code: str = ""
    until: float | None = None

    @property
    def run(self) -> bool:
        """Whether the machine may compute now."""
        return self.state == "running"

    @property
    def text(self) -> str:
        """``running`` or ``paused: on battery`` / ``waiting: computer in use, …``."""
        return self.state if self.run else f"{self.state}: {self.reason}"

    def as_dict(self) -> VerdictView:
        """The verdict as JSON (the status snapshot's ``policy.verdict``)."""
        return VerdictView(state=self.state, reason=self.reason, code=self.code, until=self.until, text=self.text)


RUN = Verdict()


@dataclass
class RunPolicy:
    """The run-when decision with its memory: since when the machine has been idle (for
    ``when_idle`` where input idleness is unknown) and how many calm samples a load pause has
    seen. ``decide(observations, now)`` is the whole interface."""

    settings: PolicySettings = field(default_factory=PolicySettings)
    _calm_since: float | None = None  # other programs' load under the idle threshold since then
    _calm_samples: int = 0  # consecutive samples under max_other_load
    _load_paused: bool = False

    def decide(self, seen: Observations, now: float) -> Verdict:
        """The verdict for the machine as ``seen`` at wall-clock ``now``. The first rule that
        pauses wins, in the order a donor would look for a reason: power, their programs, the
        clock, the transfer cap, load, idleness."""
        s = self.settings
        self._track_load(seen, now)
        if s.on_battery and seen.on_battery:
            return Verdict("paused", "on battery", "battery")
        running = sorted(p for p in s.pause_programs if p.lower() in seen.programs)
        if running:
            return Verdict("paused", f"{running[0]} is running", "program")
        if s.pause_on_gpu_use and seen.gpu_users:  # unknown (None) never pauses: the status says so
            return Verdict("paused", f"{sorted(seen.gpu_users)[0]} uses the GPU", "gpu")
        minute = _local_minute(now)
        for code, windows, what in (("hours", s.compute_hours, "computing"), ("network_hours", s.network_hours, "network")):
            if windows and not any(w.contains(minute) for w in windows):
                opens = min(windows, key=lambda w: w.minutes_until_start(minute))
                until = now + opens.minutes_until_start(minute) * 60
                return Verdict("paused", f"outside {what} hours, resumes at {_clock(until)}", code, until)
        if s.daily_transfer and seen.transferred_today + seen.transfer_ahead >= s.daily_transfer:
            until = _next_local_midnight(now)
            reached = "reached" if seen.transferred_today >= s.daily_transfer else "reached at this rate before the next look"
            return Verdict("paused", f"daily transfer cap of {format_size(s.daily_transfer)} {reached}, resumes at midnight",
                           "transfer", until)
        if self._load_paused:
            load = seen.other_load if seen.other_load is not None else 0.0
            return Verdict("paused", f"other programs use {load:.0f} % CPU (limit {s.max_other_load:g} %)", "load")
        if s.when_idle:
            idle_s = self._idle_seconds(seen, now)
            if idle_s < s.when_idle * 60:
                resumes = now + (s.when_idle * 60 - idle_s) if idle_s > 0 else None
                return Verdict("waiting", f"computer in use, resumes after {_minutes(s.when_idle)}", "idle", resumes)
        return RUN

    def _track_load(self, seen: Observations, now: float) -> None:
        load = seen.other_load
        if load is None:
            return
        if load < self.settings.idle_load:
            if self._calm_since is None:
                self._calm_since = now
        else:
            self._calm_since = None
        limit = self.settings.max_other_load
        if limit is None:
            self._load_paused = False
        elif load > limit:
            self._load_paused, self._calm_samples = True, 0
        elif self._load_paused:
            self._calm_samples += 1
            if self._calm_samples >= LOAD_RESUME_SAMPLES:
                self._load_paused = False

    def _idle_seconds(self, seen: Observations, now: float) -> float:
        """How long the machine has been idle: input idleness where the platform tells, else
        how long other programs' load has stayed under the idle threshold."""
        if seen.input_idle_s is not None:
            return max(0.0, seen.input_idle_s)
        if self._calm_since is None:
            return 0.0
        return max(0.0, now - self._calm_since)


__all__ = ["GPU_USE_LINE", "GPU_USE_UNKNOWN", "Observations", "PolicyError", "PolicySettings", "RunPolicy", "Verdict", "Window", "local_day", "settings_from"]
