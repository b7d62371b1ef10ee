"""Exact recompute: check one receipted reply against the state its host signed. No trio.

Given a reply's receipt (``receipts.py``), the snapshot its host served for the receipt's state
id (``snapshots.py``; the host's binding of that id to a digest is checked here when given, as
for a proof read from another peer: an auditor that fetched the snapshot from the host itself
judges what the host sent, ``client.fetch_snapshot``), what the trainer sent and what it got
back, ``Recomputer.check`` says one of:

- ``PASSED``: the snapshot is the state the receipt names, the receipt names the inputs we sent,
  and recomputing the call from them (same expert class, the reply's encoding applied to our
  result) gives the reply within ``tolerance`` (relative L2): hardware noise. Measured on this
  machine: the same batch shape and thread count give bit-identical results; other batchings or
  thread counts about 5e-7 relative; a lie of 2 % is 2e-2.
- ``CONTRADICTED``: all of that holds but the reply is off by more than the tolerance: a
  **proof** (signed receipt, our inputs, our recompute) that the host lied; one excludes it.
- ``FALSE_RECEIPT``: the signature is not the host's, the snapshot (with its binding) is not the
  state the receipt names, or the receipt names other inputs than those we sent (encoding is
  deterministic: an honest host never signs other ones): treated as a lie for that reply.

The tolerance is of the recompute, not of honest drift between replicas: it does not grow with
sync ages, and it is the same for every host, proven or not.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Sequence

import torch

from .distance import distance
from .config import DEFAULT_CONFIG, ExpertsConfig
from .receipts import BACKWARD, Receipt, StateBinding, binds, tensor_digest
from .snapshots import module_of, state_digest
from .tensors import deserialize, serialize

DEFAULT_TOLERANCE = 1e-3  # relative L2 of a recomputed reply; honest noise ~5e-7, a 2 % lie 2e-2


class Verdict(enum.Enum):
    """What a recompute found (see the module docstring)."""

    PASSED = "passed"
    CONTRADICTED = "contradicted"
    FALSE_RECEIPT = "false receipt"


@dataclass(frozen=True)
class Finding:
    """A recompute's verdict, the relative error it measured (None when it did not get that far)
    and why, in words."""

    verdict: Verdict
    error: float | None
    detail: str
    recomputed: tuple[torch.Tensor, ...] = ()  # what the state gives for our inputs (a proof's half)


def as_received(tensors: Sequence[torch.Tensor], compression: str, config: ExpertsConfig = DEFAULT_CONFIG) -> list[torch.Tensor]:
    """``tensors`` as a peer decodes them after they travelled in ``compression`` (themselves for
    ``none``)."""
    if compression == "none":
        return [t.detach().cpu() for t in tensors]
    header, chunks = serialize(list(tensors), compression, config=config)
    return deserialize(header, b"".join(bytes(c) for c in chunks), config=config)


FLIP_SHARE = 0.01  # values of a lossy reply that may sit one rounding step off a recompute's


def rounding_only(ours: Sequence[torch.Tensor], replied: Sequence[torch.Tensor], share: float = FLIP_SHARE) -> bool:
    """Whether a lossy reply differs from our identically encoded recompute only where hardware
    noise tipped a value over a rounding boundary: no value more than one step off (at most the
    tensor's absmax / 127, 8-bit blockwise's coarsest), and at most ``share`` of them (at least
    one) a step off at all. One tipped value of a small reply can weigh 1e-3 of its norm; a lie
    of 2 % moves most values a step or more."""
    if len(ours) != len(replied):
        return False
    tipped = total = 0
    for a, b in zip(ours, replied):
        if a.shape != b.shape:
            return False
        a, b = a.detach().float(), b.detach().float()
        if not b.numel():
            continue
        step = float(b.abs().max()) / 127.0
        diff = (a - b).abs()
        if not bool(torch.isfinite(diff).all()) or bool((diff > 1.01 * step).any()):
            return False
        tipped += int((diff > 0.5 * step).sum())
        total += b.numel()
    return tipped <= max(1, share * total)


class Recomputer:
    """Recomputes receipted replies; keeps one module per (class, hidden_dim) to load snapshots
    into. Thread-safe (one recompute at a time): auditors run it off the event loop."""

    def __init__(self, tolerance: float = DEFAULT_TOLERANCE, config: ExpertsConfig = DEFAULT_CONFIG) -> None:
        self.tolerance = tolerance
        self.config = config
        self._modules: dict = {}
        self._loaded: dict = {}  # (class, hidden_dim) -> the snapshot tensors its module holds now
        self._checked: dict[bytes, object] = {}  # a binding's digest -> the tensors that matched it (held)
        self._lock = threading.Lock()

    def check(
        self, receipt: Receipt, peer: object, names: Sequence[str], tensors: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor], replied: Sequence[torch.Tensor],
        grad_outputs: Sequence[torch.Tensor] | None = None, input_compression: str | None = None,
        binding: StateBinding | None = None,
    ) -> Finding:
        """Check ``replied`` (a forward's outputs; with ``grad_outputs``, a backward's input
        gradients) against ``receipt`` and the snapshot (``names``, ``tensors``) its host served.
        ``inputs`` and ``grad_outputs``: what we sent; ``input_compression``: the encoding the
        inputs travelled in, when not the receipt's (a backward whose inputs the forward sent).
        ``binding``: the snapshot's, to check here (a proof read from another peer); without it,
        the tensors are what the host itself sent under the receipt's id."""
        if not receipt.verify(peer):
            return Finding(Verdict.FALSE_RECEIPT, None, "its receipt's signature is not its own")
        if binding is not None and not self._bound(receipt, binding, names, tensors):
            return Finding(Verdict.FALSE_RECEIPT, None, f"the state it served is not the one its receipt names "
                                                        f"(version {receipt.version})")
        backward = receipt.op == BACKWARD
        if backward != (grad_outputs is not None):
            return Finding(Verdict.FALSE_RECEIPT, None, "its receipt names another call")
        sent = self._sent(receipt, inputs, grad_outputs, input_compression)
        if sent is None:
            return Finding(Verdict.FALSE_RECEIPT, None, "its receipt names other inputs than those we sent")
        sent_inputs, sent_grads = sent
        with self._lock:
            # the same fetched snapshot audited again (one per state version): load once
            key = (receipt.expert_class, receipt.hidden_dim)
            try:
                if self._loaded.get(key) is not tensors:
                    self._loaded.pop(key, None)
                    module = module_of(receipt.expert_class, receipt.hidden_dim, names, tensors, self._modules)
                    self._loaded[key] = tensors
                else:
                    module = self._modules[key]
            except Exception as exc:  # noqa: BLE001 - a state that fits no module of its class is a false one
                return Finding(Verdict.FALSE_RECEIPT, None, f"its state does not fit a {receipt.expert_class!r} "
                                                            f"expert: {exc}")
            try:
                ours = self._run(module, sent_inputs, sent_grads)
            except Exception as exc:  # noqa: BLE001 - a state that cannot compute our call did not compute the reply
                return Finding(Verdict.FALSE_RECEIPT, None, f"the state it signed cannot compute this call: {exc}")
        ours = as_received(ours, receipt.compression, self.config)
        error = distance(ours, list(replied))
        what = "input gradients" if backward else "outputs"
        if error <= self.tolerance or (receipt.compression != "none" and rounding_only(ours, list(replied))):
            return Finding(Verdict.PASSED, error, f"its {what} match a recompute (relative error {error:.2g})",
                           tuple(ours))
        return Finding(Verdict.CONTRADICTED, error,
                       f"its {what} differ from a recompute from the state it signed (version {receipt.version}) by "
                       f"a relative {error:.3g}, at most {self.tolerance:g}", tuple(ours))

    def _bound(self, receipt: Receipt, binding: StateBinding, names, tensors) -> bool:
        """Whether ``binding`` is the host's (``check`` verified the receipt is ``peer``'s), names
        the receipt's state, and digests ``tensors``."""
        if not binds(binding, receipt):
            return False
        if self._checked.get(binding.digest) is tensors:
            return True  # the same fetched snapshot checked again (a forward and its backward): hashed once
        if state_digest(list(zip(names, tensors))) != binding.digest:
            return False
        with self._lock:
            self._checked[binding.digest] = tensors
            while len(self._checked) > 4:
                del self._checked[next(iter(self._checked))]
        return True

    def _sent(self, receipt: Receipt, inputs, grad_outputs, input_compression):
        """Our inputs (and gradients) as the host decoded them, if the receipt names them."""
        encodings = [receipt.compression] if input_compression in (None, receipt.compression) else [
            input_compression, receipt.compression]
        for encoding in encodings:
            sent_inputs = as_received(inputs, encoding, self.config)
            sent_grads = as_received(grad_outputs, receipt.compression, self.config) if grad_outputs is not None else None
            if tensor_digest([*sent_inputs, *(sent_grads or [])]) == receipt.inputs:
                return sent_inputs, sent_grads
        return None

    @staticmethod
    def _run(module: torch.nn.Module, inputs: list[torch.Tensor], grads: list[torch.Tensor] | None) -> list[torch.Tensor]:
        if grads is None:
            with torch.no_grad():
                out = module(*inputs)
            return [t.detach() for t in (out if isinstance(out, (list, tuple)) else [out])]
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        with torch.enable_grad():
            out = module(*leaves)
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        for p in module.parameters():
            p.grad = None
        return [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]


__all__ = ["DEFAULT_TOLERANCE", "FLIP_SHARE", "Finding", "Recomputer", "Verdict", "as_received", "rounding_only"]
