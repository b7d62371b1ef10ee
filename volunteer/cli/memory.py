"""What the experts will take of the device's memory, said before any is built.

``volunteer join`` estimates it from the expert class and width (each module is built on torch's
``meta`` device: shapes only, no memory), the number of experts (the ``--experts`` given, or as
many as automatic placement will host) and what training one costs (parameters, gradients and
Adam's two moments, with a margin for a batch's activations: the same figures placement sizes
itself by). It prints one line, or refuses in one line when the estimate is more than the memory
allowed: ``--max-gpu-memory`` of a GPU, or what the device has free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import VolunteerError
from ..sizes import format_size

if TYPE_CHECKING:
    import torch

    from ..kinds.options import VolunteerOptions
    from ..swarmfile import GridSpec


@dataclass(frozen=True)
class MemoryEstimate:
    """``experts`` experts of ``per_expert`` bytes each on ``device``, against ``allowed`` bytes
    (``allowed_by`` says where that bound comes from; None: unknown)."""

    experts: int
    per_expert: int
    device: str
    allowed: int | None
    allowed_by: str

    @property
    def total(self) -> int:
        """Bytes the experts take in all."""
        return self.experts * self.per_expert

    @property
    def fits(self) -> bool:
        """Whether the experts fit in the memory allowed (True when that is unknown)."""
        return self.allowed is None or self.total <= self.allowed

    def line(self) -> str:
        """``memory estimate: 8 experts × 201.3 MiB = 1.6 GiB on cuda:0, of 21.6 GiB allowed (…)``."""
        of = f", of {format_size(self.allowed)} {self.allowed_by}" if self.allowed is not None else ""
        return (f"memory estimate: {self.experts} expert{'' if self.experts == 1 else 's'} × "
                f"{format_size(self.per_expert)} = {format_size(self.total)} on {self.device}{of}")

    def refusal(self) -> str:
        """The one line ``join`` stops with when the experts do not fit."""
        return (f"the experts would not fit: {self.line().removeprefix('memory estimate: ')}; host fewer "
                "(--max-experts N, or fewer --experts), a smaller --hidden-dim, or another --device")


def bytes_per_expert(expert_class: str, hidden_dim: int) -> int:
    """Training memory of one expert of ``expert_class`` at ``hidden_dim``: placement's figure
    (parameters, gradients, Adam's moments, and a margin for activations)."""
    import torch

    from ..experts.layers import get_expert_class
    from ..replicas.manager import ACTIVATION_MARGIN
    from ..replicas.placement import expert_memory_bytes

    with torch.device("meta"):  # shapes only: nothing is allocated
        module = get_expert_class(expert_class).build(hidden_dim)
    parameters = sum(p.numel() for p in module.parameters())
    return int(expert_memory_bytes(parameters) * ACTIVATION_MARGIN)


def allowed_memory(device: "torch.device", max_gpu_memory: float | None,
                   max_ram: int | None = None) -> tuple[int | None, str]:
    """Bytes the experts may take on ``device`` (a torch.device) and where that bound comes
    from: ``--max-gpu-memory`` of a GPU's memory, ``--max-ram`` on the CPU, else what the GPU
    or the machine has free."""
    if device.type == "cuda":
        import torch

        index = device.index or 0
        if max_gpu_memory:
            total = torch.cuda.get_device_properties(index).total_memory
            return int(total * max_gpu_memory), f"allowed by --max-gpu-memory {max_gpu_memory:g}"
        free, _total = torch.cuda.mem_get_info(index)
        return int(free), "free"
    if device.type == "cpu":
        import psutil

        available = int(psutil.virtual_memory().available)
        if max_ram and max_ram < available:
            return int(max_ram), f"allowed by --max-ram {format_size(int(max_ram))}"
        return available, "available"
    return None, ""  # mps, xpu: torch does not say how much is free


def estimate_for(options: "VolunteerOptions", grids: Sequence["GridSpec"]) -> MemoryEstimate | None:
    """The estimate for a volunteer's options (``VolunteerOptions``) and its swarm's grids; None
    when it hosts nothing, on a GPU that is not there (the node's device check refuses it), or
    for an expert class not known yet (an ``--expert-file`` registers its classes when the node
    starts: those are not estimated)."""
    from ..experts.backend import resolve_device
    from ..experts.layers import get_expert_class
    from ..replicas.manager import placement_capacity

    o = options
    device = resolve_device(o.device)
    if device.type == "cuda":
        import torch

        if not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count():
            return None  # no such GPU: the node's device check says so in one line
    if o.uids:
        kinds = [(o.expert_class or "", o.hidden_dim)]
        count = len(o.uids)
    elif o.place and grids:
        kinds = [(g.expert_class, g.hidden_dim) for g in grids]
        count = placement_capacity(grids, device, max_experts=o.max_experts, max_gpu_memory=o.max_gpu_memory,
                                   max_ram=o.max_ram)
    else:
        return None
    for name, _ in kinds:
        try:
            get_expert_class(name)
        except VolunteerError:
            return None  # a class of --expert-file: registered when the node loads the file
    per_expert = max(bytes_per_expert(name, hidden) for name, hidden in kinds)
    allowed, allowed_by = allowed_memory(device, o.max_gpu_memory, o.max_ram)
    return MemoryEstimate(count, per_expert, str(device), allowed, allowed_by)


__all__ = ["MemoryEstimate", "allowed_memory", "bytes_per_expert", "estimate_for"]
