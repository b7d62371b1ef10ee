"""The training loop both trainers of benchmarks/wan.py run (ours, and hivemind's in its own venv,
which imports this file too): same data, loss, optimizer and timing, so the side-by-side
compares like with like. Needs only the standard library and torch.

Each step is timed from before the forward to after the optimizer step, and the bytes of the
trainer's line (its interface's counters in /proc/net/dev, which a network namespace scopes to
its own interfaces) are read at both ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

LR = 1e-3


def line_bytes(ifname: str) -> tuple[int, int]:
    """(sent, received) bytes of interface ``ifname`` so far, frames and headers included."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == ifname:
                fields = rest.split()
                return int(fields[8]), int(fields[0])
    raise LookupError(f"no interface {ifname!r} in /proc/net/dev")


def default_ifname() -> str:
    """The namespace's one interface besides lo (the trainer's line)."""
    with open("/proc/net/dev") as f:
        names = [line.partition(":")[0].strip() for line in f if ":" in line]
    others = [n for n in names if n != "lo"]
    if len(others) != 1:
        raise LookupError(f"expected one interface besides lo, found {others}")
    return others[0]


def train(moe: torch.nn.Module, *, hidden: int, batch: int, steps: int, ifname: str,
          before_step: Callable[[int], None] | None = None, seed: int = 0, seq: int = 0) -> list[dict]:
    """``steps`` training steps of ``moe`` on a regression task; per step: ``t0``/``t1``
    (time.monotonic), ``tx0``/``rx0`` and ``tx``/``rx`` (line bytes before and after), ``loss``.
    ``seq``: samples are sequences of this many positions (``[batch, seq, hidden]``, for
    sequence experts such as ``transformer``); 0: vectors (``[batch, hidden]``)."""
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(hidden, hidden, generator=generator) / hidden ** 0.5
    optimizer = torch.optim.Adam(moe.parameters(), lr=LR)
    out = []
    for i in range(steps):
        if before_step is not None:
            before_step(i)
        x = torch.randn(batch, *((seq,) if seq else ()), hidden, generator=generator)
        target = torch.tanh(x @ mixing)
        tx0, rx0 = line_bytes(ifname)
        t0 = time.monotonic()
        loss = torch.nn.functional.mse_loss(moe(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        t1 = time.monotonic()
        tx, rx = line_bytes(ifname)
        out.append({"t0": t0, "t1": t1, "tx0": tx0, "rx0": rx0, "tx": tx, "rx": rx, "loss": float(loss)})
    return out
