"""The one seam between run-when policies and the machine: battery, other programs' load,
program names, programs using the GPU, input idleness and the wall clock.

``PsutilProbe`` asks psutil (one library for Linux, Windows and macOS) and, for input idleness,
what the platform offers (Windows' GetLastInputInfo, macOS' HIDIdleTime, logind's idle hint on
Linux). ``FakeProbe`` reads the same figures from a JSON file that a test rewrites while a daemon
runs: a fake battery, a fake busy process, a fake clock. ``probe_from_env`` picks one from
``VOLUNTEER_PROBE``:

* unset: ``PsutilProbe()``, the whole machine;
* ``fake:PATH``: ``FakeProbe(PATH)``;
* ``tree:PID``: ``PsutilProbe`` that counts only the processes under PID as "other programs",
  so a test on a shared machine sees its own burner and not everyone else's load.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..errors import VolunteerError

log = logging.getLogger(__name__)

PROBE_ENV = "VOLUNTEER_PROBE"
FAKE_FILE_LIMIT = 64 * 1024  # bytes of a fake probe file read
PROGRAM_LIMIT = 4096  # processes looked at per sample (a fork bomb does not stall the daemon)
COMMAND_TIMEOUT = 2.0  # seconds for a platform tool asked about input idleness


class ProbeError(VolunteerError):
    """A probe cannot be set up (a bad ``VOLUNTEER_PROBE``)."""


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one instant: busy time of the programs counted as "others"
    (``others``: already without ours), across ``cpus`` CPUs, at ``wall`` (monotonic seconds)."""

    wall: float
    others: float
    cpus: int


def other_load(before: CpuSample | None, after: CpuSample) -> float | None:
    """Other programs' share of the machine between two samples, in % (None for the first)."""
    if before is None or after.wall <= before.wall:
        return None
    span = (after.wall - before.wall) * max(1, after.cpus)
    return round(min(100.0, max(0.0, (after.others - before.others) / span * 100)), 1)


class SystemProbe(Protocol):
    """What the policy service asks the machine, once per sample."""

    def now(self) -> float:
        """Wall-clock seconds (the policy's time of day and midnight come from it)."""
        ...

    def on_battery(self) -> bool | None:
        """True on battery, False on mains power, None without a battery sensor."""
        ...

    def cpu(self) -> CpuSample | None:
        """Cumulative busy CPU seconds of other programs; None where unknown."""
        ...

    def other_load(self) -> float | None:
        """Other programs' CPU load in %, when the probe knows it directly (a fake); else None
        and the service derives it from two ``cpu()`` samples."""
        ...

    def programs(self) -> frozenset[str]:
        """Lower-case names of the programs running now."""
        ...

    def input_idle_s(self) -> float | None:
        """Seconds since the last keyboard or mouse input; None where the platform does not tell."""
        ...

    def gpu_users(self) -> frozenset[str] | None:
        """Lower-case names of other programs using a GPU now; None where nothing tells (no
        NVIDIA driver tools: nvidia-ml-py and nvidia-smi both absent or failing)."""
        ...


# --- the real machine -----------------------------------------------------------------------------


def parse_logind_idle(text: str, now: float) -> float | None:
    """Seconds idle from ``loginctl show-session -p IdleHint -p IdleSinceHint`` output (the
    hint's time is in microseconds since the epoch); None when the output does not say."""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    hint = fields.get("IdleHint")
    if hint == "no":
        return 0.0
    since = fields.get("IdleSinceHint", "")
    if hint == "yes" and since.isdigit() and int(since) > 0:
        return max(0.0, now - int(since) / 1e6)
    return None


def parse_hid_idle(text: str) -> float | None:
    """Seconds idle from macOS' ``ioreg -c IOHIDSystem`` output (HIDIdleTime in nanoseconds)."""
    match = re.search(r'"HIDIdleTime"\s*=\s*(\d+)', text)
    return int(match.group(1)) / 1e9 if match else None


class PsutilProbe:
    """The real machine through psutil; ``tree`` limits "other programs" to one process tree."""

    def __init__(self, tree: int | None = None) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self._tree = tree
        self._idle_source: str | None = "unknown"  # which input-idleness source works, once found
        self._logind_session: str | None = None
        self._tree_times: dict[int, float] = {}  # pid -> CPU seconds at the last sample
        self._tree_total = 0.0
        self._gpu_unknown_said = False

    def now(self) -> float:
        """Wall-clock seconds."""
        return time.time()

    def on_battery(self) -> bool | None:
        """psutil's battery: None on a desktop (no sensor) or where psutil cannot read it."""
        try:
            battery = self._psutil.sensors_battery()
        except (AttributeError, OSError, RuntimeError):  # sensors_battery is missing on some BSDs
            return None
        if battery is None or battery.power_plugged is None:
            return None
        return not battery.power_plugged

    def _own_seconds(self) -> float:
        times = self._me.cpu_times()
        return times.user + times.system + times.children_user + times.children_system

    def cpu(self) -> CpuSample | None:
        """Busy CPU seconds of everyone but this daemon (or of the watched tree)."""
        psutil = self._psutil
        wall = time.monotonic()
        cpus = psutil.cpu_count() or 1
        if self._tree is not None:
            return CpuSample(wall, self._tree_seconds(), cpus)
        times = psutil.cpu_times()
        idle = times.idle + getattr(times, "iowait", 0.0)
        busy = sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        return CpuSample(wall, max(0.0, busy - self._own_seconds()), cpus)

    def _tree_seconds(self) -> float:
        # cumulative per process; a process that exits takes its counter with it, so the total
        # grows by each process's increase since the last sample instead
        psutil = self._psutil
        try:
            root = psutil.Process(self._tree)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        seen: dict[int, float] = {}
        for proc in procs:
            if proc.pid == self._me.pid:
                continue
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            seen[proc.pid] = times.user + times.system
        for pid, seconds in seen.items():
            self._tree_total += max(0.0, seconds - self._tree_times.get(pid, seconds))
        self._tree_times = seen
        return self._tree_total

    def other_load(self) -> float | None:
        """Derived from ``cpu()`` samples by the service."""
        return None

    def programs(self) -> frozenset[str]:
        """Names of running processes (and their executables' names), lower case."""
        psutil = self._psutil
        names: set[str] = set()
        if self._tree is not None:
            try:
                root = psutil.Process(self._tree)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                return frozenset()
        else:
            procs = psutil.process_iter(["name"])
        for index, proc in enumerate(procs):
            if index >= PROGRAM_LIMIT:
                break
            try:
                name = proc.info["name"] if hasattr(proc, "info") else proc.name()
            except psutil.Error:
                continue
            if name:
                names.add(name.lower())
                names.add(os.path.splitext(name.lower())[0])  # "steam.exe" matches "steam"
        return frozenset(names)

    def gpu_users(self) -> frozenset[str] | None:
        """Other programs with a context on an NVIDIA GPU, through NVML (nvidia-ml-py), else
        ``nvidia-smi``; None when neither answers (said once in the log, never raised)."""
        pids = self._nvml_gpu_pids()
        if pids is None:
            pids = self._smi_gpu_pids()
        if pids is None:
            if not self._gpu_unknown_said:
                self._gpu_unknown_said = True
                log.info("cannot tell which programs use the GPU: no NVML (nvidia-ml-py) or nvidia-smi answered")
            return None
        names: set[str] = set()
        own = {os.getpid()}
        for pid in sorted(pids - own)[:PROGRAM_LIMIT]:
            try:
                names.add(os.path.splitext(self._psutil.Process(pid).name().lower())[0])
            except self._psutil.Error:
                continue  # gone since, or not ours to look at
        return frozenset(names)

    def _nvml_gpu_pids(self) -> set[int] | None:
        try:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - no module, no library, no driver: all mean "NVML does not tell"
            log.debug("NVML unavailable for the GPU-use policy: %s", exc)
            return None
        try:
            pids: set[int] = set()
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                for query in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
                    pids.update(int(p.pid) for p in query(handle))
            return pids
        except Exception as exc:  # noqa: BLE001 - a driver that answers nothing useful is "unknown" too
            log.debug("NVML could not list GPU processes: %s", exc)
            return None
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception as exc:  # noqa: BLE001
                log.debug("NVML shutdown: %s", exc)

    def _smi_gpu_pids(self) -> set[int] | None:
        try:
            done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.debug("nvidia-smi unavailable for the GPU-use policy: %s", exc)
            return None
        if done.returncode != 0:
            return None
        return {int(word) for word in done.stdout.split() if word.isdigit()}

    def input_idle_s(self) -> float | None:
        """Seconds since the last input, from the platform; None where it does not tell."""
        if self._idle_source is None:
            return None
        try:
            if sys.platform == "win32":
                return self._windows_idle()
            if sys.platform == "darwin":
                out = subprocess.run(["ioreg", "-c", "IOHIDSystem", "-d", "4"], capture_output=True, text=True,
                                     timeout=COMMAND_TIMEOUT).stdout
                return self._found(parse_hid_idle(out))
            return self._found(self._logind_idle())
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            log.info("input idleness unknown on this machine (%s): idle means low load from other programs", exc)
            self._idle_source = None
            return None

    def _found(self, value: float | None) -> float | None:
        if value is None and self._idle_source == "unknown":
            self._idle_source = None  # this machine does not tell: stop asking every sample
        elif value is not None:
            self._idle_source = "known"
        return value

    def _windows_idle(self) -> float | None:
        class LastInput(ctypes.Structure):
            """Windows' LASTINPUTINFO."""

            _fields_ = [("cbSize", ctypes.c_uint), ("dwTime", ctypes.c_uint)]

        info = LastInput()
        info.cbSize = ctypes.sizeof(info)
        windll = getattr(ctypes, "windll")
        if not windll.user32.GetLastInputInfo(ctypes.byref(info)):
            return None
        return ((windll.kernel32.GetTickCount() - info.dwTime) & 0xFFFFFFFF) / 1000.0

    def _logind_idle(self) -> float | None:
        # the user's graphical session, if any: a server or a container has none
        if self._logind_session is None:
            sessions = subprocess.run(["loginctl", "list-sessions", "--no-legend"], capture_output=True, text=True,
                                      timeout=COMMAND_TIMEOUT).stdout
            user = str(os.getuid()) if hasattr(os, "getuid") else ""
            for line in sessions.splitlines():
                parts = line.split()
                if len(parts) < 2 or parts[1] != user:
                    continue
                kind = subprocess.run(["loginctl", "show-session", parts[0], "-p", "Type", "--value"],
                                      capture_output=True, text=True, timeout=COMMAND_TIMEOUT).stdout.strip()
                if kind in ("x11", "wayland", "mir"):
                    self._logind_session = parts[0]
                    break
            else:
                return None
        out = subprocess.run(["loginctl", "show-session", self._logind_session, "-p", "IdleHint", "-p", "IdleSinceHint"],
                             capture_output=True, text=True, timeout=COMMAND_TIMEOUT).stdout
        return parse_logind_idle(out, time.time())


# --- a machine a test describes -------------------------------------------------------------------


class FakeProbe:
    """Figures from a JSON file, re-read at every sample, so a test drives a running daemon:
    ``{"now": "2030-01-01T23:30:00" or epoch, "running": true, "on_battery": true,
    "other_load": 80, "programs": ["steam"], "input_idle_s": 30, "gpu_users": ["blender"]}``; a missing key means "the
    platform does not tell" (``now`` missing: the real clock; ``running``: the fake clock runs
    from ``now`` on, else it stands still)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict:
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read(FAKE_FILE_LIMIT))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("fake probe %s unreadable: %s", self.path, exc)
            return {}
        return data if isinstance(data, dict) else {}

    def now(self) -> float:
        """The file's ``now`` (ISO local time or epoch seconds), else the real clock; with
        ``"running": true`` the fake clock starts at ``now`` when the file was written and runs."""
        data = self._read()
        value = data.get("now")
        base: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            base = float(value)
        elif isinstance(value, str):
            import datetime

            try:
                base = datetime.datetime.fromisoformat(value).timestamp()
            except ValueError:
                log.warning("fake probe: now %r is not an ISO time", value[:40])
        if base is None:
            return time.time()
        if data.get("running") is True:
            try:
                base += max(0.0, time.time() - self.path.stat().st_mtime)
            except OSError:
                pass
        return base

    def on_battery(self) -> bool | None:
        """The file's ``on_battery``."""
        value = self._read().get("on_battery")
        return value if isinstance(value, bool) else None

    def cpu(self) -> CpuSample | None:
        """A fake has no CPU counters: it states the load itself."""
        return None

    def other_load(self) -> float | None:
        """The file's ``other_load`` (%)."""
        value = self._read().get("other_load")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def programs(self) -> frozenset[str]:
        """The file's ``programs``."""
        value = self._read().get("programs")
        return frozenset(str(v).lower() for v in value) if isinstance(value, list) else frozenset()

    def input_idle_s(self) -> float | None:
        """The file's ``input_idle_s``."""
        value = self._read().get("input_idle_s")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def gpu_users(self) -> frozenset[str] | None:
        """The file's ``gpu_users`` (programs using the GPU); missing: nothing tells."""
        value = self._read().get("gpu_users")
        return frozenset(str(v).lower() for v in value) if isinstance(value, list) else None


def probe_from_env(environ: dict | None = None) -> SystemProbe:
    """The probe ``VOLUNTEER_PROBE`` names (see the module docstring); ProbeError for a bad value."""
    value = (os.environ if environ is None else environ).get(PROBE_ENV, "")
    if not value:
        return PsutilProbe()
    kind, _, arg = value.partition(":")
    if kind == "fake" and arg:
        return FakeProbe(Path(arg))
    if kind == "tree" and arg.isdigit():
        return PsutilProbe(tree=int(arg))
    raise ProbeError(f"{PROBE_ENV}={value[:60]!r}: expected fake:PATH or tree:PID (or leave it unset)")


__all__ = ["CpuSample", "FakeProbe", "PROBE_ENV", "ProbeError", "PsutilProbe", "SystemProbe", "other_load",
           "parse_hid_idle", "parse_logind_idle", "probe_from_env"]
