"""The memory estimate ``join`` prints: placement's per-expert figure from the class's shapes
(built on the meta device), and the line and refusal it gives."""

from __future__ import annotations

from volunteer.cli.memory import MemoryEstimate, bytes_per_expert
from volunteer.replicas.manager import ACTIVATION_MARGIN
from volunteer.replicas.placement import expert_memory_bytes


def test_one_expert_costs_what_placement_sizes_itself_by():
    import torch

    from volunteer.experts.layers import get_expert_class

    initialized = torch.cuda.is_initialized()  # an earlier test on a GPU machine may have
    parameters = sum(p.numel() for p in get_expert_class("ffn").build(32).parameters())
    assert bytes_per_expert("ffn", 32) == int(expert_memory_bytes(parameters) * ACTIVATION_MARGIN)
    assert bytes_per_expert("ffn", 64) > bytes_per_expert("ffn", 32)
    assert torch.cuda.is_initialized() == initialized  # counting shapes touched no device


def test_the_line_and_the_refusal():
    fits = MemoryEstimate(8, 2**20, "cuda:0", 2**30, "allowed by --max-gpu-memory 0.5")
    assert fits.fits and fits.line() == (
        "memory estimate: 8 experts × 1.0 MiB = 8.0 MiB on cuda:0, of 1.0 GiB allowed by --max-gpu-memory 0.5")
    too_big = MemoryEstimate(4, 2**30, "cpu", 2**31, "available")
    assert not too_big.fits and too_big.refusal().startswith("the experts would not fit: 4 experts × 1.0 GiB = 4.0 GiB on cpu")
    assert MemoryEstimate(1, 10, "mps", None, "").fits  # unknown bound: nothing refused
