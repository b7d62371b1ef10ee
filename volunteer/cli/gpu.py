"""GPU figures for the dashboard through NVML (``pip install 'volunteer[gpu]'``: nvidia-ml-py).

``GpuMonitor.read(device)`` returns utilisation, memory, temperature and power of the CUDA device
the experts run on, or ``{"available": False, "reason": ...}`` saying why not (not a CUDA device,
nvidia-ml-py not installed, no driver, ...). NVML is initialised once and only when asked; a
failure is remembered so a missing driver is not retried twice a second.
"""

from __future__ import annotations

import importlib
from typing import Any

INSTALL_HINT = "pip install 'volunteer[gpu]'"


def _cuda_index(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


class GpuMonitor:
    """Reads one CUDA device's figures through NVML; ``nvml`` may be a stand-in (tests)."""

    def __init__(self, nvml: Any = None) -> None:
        self._nvml = nvml
        self._failure: str | None = None
        self._ready = False

    def _start(self) -> Any:
        if self._ready:
            return self._nvml
        if self._failure is not None:
            raise RuntimeError(self._failure)
        try:
            if self._nvml is None:
                self._nvml = importlib.import_module("pynvml")
        except ImportError:
            self._failure = f"no nvidia-ml-py: {INSTALL_HINT}"
            raise RuntimeError(self._failure) from None
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: all mean "no figures"
            self._failure = f"NVML unavailable: {_describe(exc)}"
            raise RuntimeError(self._failure) from None
        self._ready = True
        return self._nvml

    def read(self, device: str) -> dict:
        """The figures of ``device`` (``cuda:N``), or ``available: False`` with the reason."""
        index = _cuda_index(device)
        if index is None:
            return {"available": False, "reason": f"experts run on {device or 'no device'}, not a CUDA GPU"}
        try:
            nvml = self._start()
        except RuntimeError as exc:
            return {"available": False, "reason": str(exc)}
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            figures: dict = {"available": True, "name": _text(nvml.nvmlDeviceGetName(handle))}
            figures["utilization_pct"] = _optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            memory = _optional(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
            figures["memory_used_mb"] = round(memory.used / 2**20) if memory is not None else None
            figures["memory_total_mb"] = round(memory.total / 2**20) if memory is not None else None
            figures["temperature_c"] = _optional(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            power = _optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle))  # milliwatts
            limit = _optional(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
            figures["power_w"] = round(power / 1000, 1) if power is not None else None
            figures["power_limit_w"] = round(limit / 1000, 1) if limit is not None else None
            return figures
        except Exception as exc:  # a device NVML cannot see (MIG, a container without it)
            return {"available": False, "reason": f"NVML cannot read GPU {index}: {_describe(exc)}"}


def _optional(read) -> Any:
    # some boards do not report power or temperature: that figure is missing, the rest still show
    try:
        return read()
    except Exception:
        return None


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


__all__ = ["GpuMonitor", "INSTALL_HINT"]
