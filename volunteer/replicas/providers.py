"""What this volunteer tells the services beside the replica manager: how many grid experts
automatic placement may host (``placement_capacity``, from the device's memory), and the
declarer's per-uid providers of versions (``versions_of``) and sync ages (``synced_ages``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import trio

from ..experts.backend import ExpertBackend
from .config import DEFAULT_CONFIG, ReplicasConfig
from .grid import GridSpec
from .placement import capacity, expert_memory_bytes
from .syncdriver import ReplicaSync

if TYPE_CHECKING:
    import torch

GPU_SHARE = 0.9  # of the device's memory placement fills when --max-gpu-memory does not say
ACTIVATION_MARGIN = 1.25  # activations of a batch on top of parameters, gradients and Adam's moments


def placement_capacity(
    grids: Sequence[GridSpec],
    device: "torch.device | None",
    *,
    max_experts: int | None = None,
    max_gpu_memory: float | None = None,
    max_ram: int | None = None,
    config: ReplicasConfig = DEFAULT_CONFIG,
) -> int:
    """How many grid experts automatic placement hosts: ``--max-experts``; else what fits in the
    allowed share of a CUDA device's memory (the grids' largest expert); else, on the CPU, what
    fits in ``--max-ram`` (at most the default 8); else (no GPU, no cap) 8."""
    on_cpu = device is None or device.type != "cuda"
    if max_experts is not None or not grids or on_cpu and not max_ram:
        return capacity(max_experts=max_experts, config=config)
    from ..experts.layers import get_expert_class

    largest = max(
        sum(p.numel() for p in get_expert_class(grid.expert_class).build(grid.hidden_dim).parameters()) for grid in grids
    )
    per_expert = int(expert_memory_bytes(largest) * ACTIVATION_MARGIN)
    if device is None or on_cpu:  # the RAM cap bounds what placement takes, as the GPU's share does on a GPU
        return min(config.default_capacity, capacity(gpu_memory_bytes=max_ram, bytes_per_expert=per_expert, config=config))
    import torch

    total = torch.cuda.get_device_properties(device.index or 0).total_memory
    return capacity(gpu_memory_bytes=int(total * (max_gpu_memory or GPU_SHARE)), bytes_per_expert=per_expert, config=config)


def synced_ages(sync: ReplicaSync) -> Callable[[str], float | None]:
    """The declarer's per-uid sync age: seconds since ``uid``'s replicas last averaged with us
    (None: never), read from the sync service."""

    def synced_age(uid: str) -> float | None:
        finished = sync.last_sync.get(uid)
        return None if finished is None else max(0.0, trio.current_time() - finished)

    return synced_age


def versions_of(backends: Mapping[str, ExpertBackend]) -> Callable[[str], int]:
    """The declarer's per-uid version provider: a hosted expert's count of optimizer updates."""

    def version(uid: str) -> int:
        backend = backends.get(uid)
        return backend.updates if backend is not None else 0

    return version


__all__ = ["placement_capacity", "synced_ages", "versions_of"]
