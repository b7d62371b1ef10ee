"""Expert backends: a torch module, its optimizer and its schema, with checkpoints.

``forward`` runs without autograd; ``backward`` recomputes the forward with autograd (as in
Learning@home), returns the gradients of the inputs and applies one optimizer step. The runtime
may instead keep a forward's graph (``forward_keeping_graph``) and backward from it
(``backward_from_graph``) when nothing changed in between (``activations.py``), and may defer the
step (``defer_step=True``) so the reply leaves first: the step is then owed, counted in
``updates`` at once, and applied by ``settle()``, which every method that computes or exports
state calls first, so nothing ever sees the parameters without it. A backend is not
thread-safe: the runtime calls it from one thread at a time.

Checkpoints hold the module, the optimizer and the update count. They are written atomically
with a checksum, the previous generation kept (``checkpoints.py``), every ``checkpoint_every``
updates and on shutdown, and ``make_backend(..., checkpoint_dir=...)`` loads the newest good
one, so a volunteer who restarts goes on from its last checkpoint; a corrupt one is moved aside.
"""

from __future__ import annotations

import copy
import math
import operator
import os
import re
import time
from pathlib import Path
from dataclasses import dataclass
from itertools import chain
from typing import Callable, Iterable, Sequence

import torch
from torch import nn

from ..errors import ExpertConfigError, ExpertInputError, GradientRefusedError
from .checkpoints import load_latest, write_checkpoint
from .config import DEFAULT_CONFIG, ExpertsConfig
from .gradbound import Check, NormBound, Verdict
from .layers import get_expert_class
from .schema import TensorSpec, check_tensors

CHECKPOINT_FORMAT = 1
_VERSION = operator.attrgetter("_version")  # a tensor's in-place change counter
_SAFE_UID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,255}$")
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """Adam, fused where this torch build has it for the parameters' device: every backward
    request takes a step, and the fused kernel is several times faster than the per-tensor loop
    (0.5 ms instead of 3.4 ms for an ffn of width 256 on one CPU core)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else as torch parses it."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ExpertConfigError(f"unknown device {device!r}: {exc}") from exc


def _as_list(outputs: object) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in outputs):
        return list(outputs)
    raise ExpertConfigError(f"an expert must return a tensor or a tuple of tensors, not {type(outputs).__name__}")


@dataclass
class ForwardGraph:
    """A forward computed with autograd, kept for the backward of the same inputs.

    ``state`` fingerprints the module when the forward ran (``ExpertBackend.state_fingerprint``);
    ``nbytes`` counts the activations the graph holds (saved tensors that are not parameters)."""

    inputs: list[torch.Tensor]  # as received: compared with torch.equal to a backward's inputs
    leaves: list[torch.Tensor]
    outputs: list[torch.Tensor]
    state: tuple
    nbytes: int


def gradient_norm(tensors: list[torch.Tensor]) -> float:
    """The L2 norm of all ``tensors`` together, by one dot product each and one device sync (a
    little faster than ``clip_grad_norm_``'s per-tensor norms: every backward pays it)."""
    flat = [t.reshape(-1) if t.dtype == torch.float32 else t.reshape(-1).float() for t in tensors]
    return math.sqrt(float(torch.stack([torch.dot(f, f) for f in flat]).sum()))


class ExpertBackend:
    """One expert served by this volunteer: module + optimizer (Adam by default) + schema."""

    def __init__(
        self,
        uid: str,
        module: nn.Module,
        *,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec] | None = None,
        optimizer: OptimizerFactory | None = None,
        config: ExpertsConfig = DEFAULT_CONFIG,
        checkpoint_path: str | os.PathLike | None = None,
        expert_class: str = "",
        hidden_dim: int | None = None,
    ) -> None:
        if not isinstance(uid, str) or not _SAFE_UID.match(uid):
            raise ExpertConfigError(f"expert uid {uid!r}: use letters, digits, '.', '_' or '-'")
        self.uid = uid
        self.config = config
        self.expert_class = expert_class
        self.hidden_dim = hidden_dim
        self.device = resolve_device(config.device)
        self.module = module.to(self.device)
        # a forward in training mode may write buffers (BatchNorm's running statistics)
        self.forward_writes_state = any(True for _ in self.module.buffers())
        self._tables: list[dict] = []  # state_fingerprint's view of the module: its tables,
        self._layout: list[list[int]] | None = None  # the ids of what they held,
        self._state_tensors: list[torch.Tensor] = []  # and the parameters and buffers, held
        self._state_ids: tuple[int, ...] = ()
        self._held: list[list] = []
        self.inputs = list(inputs)
        if not self.inputs:
            raise ExpertConfigError(f"expert {uid!r} takes no inputs: give at least one TensorSpec")
        self.outputs = list(outputs) if outputs is not None else self._infer_outputs()
        trainable = any(p.requires_grad for p in self.module.parameters())
        make = optimizer or (lambda ps: default_optimizer(ps, config.learning_rate))
        # built at its first use: a torch optimizer imports torch._dynamo as it first takes
        # parameters (about 1.2 s of CPU, a third of a daemon's start), which a donor nobody
        # calls never needs. The runtime runs one job on an expert at a time: no two first uses
        self._make_optimizer: OptimizerFactory | None = make if trainable else None
        self._optimizer: torch.optim.Optimizer | None = None
        self.updates = 0  # optimizer steps taken, across restarts
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path is not None else None
        self._saved_at = 0  # self.updates when the last checkpoint was written or loaded
        self._step_owed = False  # a deferred optimizer step, already counted in self.updates
        self.last_checkpoint_time: float | None = None  # wall clock of the last save, for the TUI
        # what one backward may move the expert (gradbound.py), and the state to go back to when
        # a trainer is refused for cause (kept from before its first clipped gradient, or from
        # before the first gradient while the bound still warms up)
        self.grad_bound = NormBound(
            factor=config.grad_bound_factor, gross=config.grad_bound_gross,
            window=config.grad_bound_window, warmup=config.grad_bound_warmup,
        )
        self.last_check: Check | None = None  # the bound's verdict on the last backward
        self._kept_state: dict | None = None
        self.suspect = False  # a clipped gradient was taken since the kept state: not a reference

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The expert's optimizer (None without trainable parameters), built at its first use."""
        if self._optimizer is None and self._make_optimizer is not None:
            # the parameters of this module: a deep copy of a backend builds its own
            params = [p for p in self.module.parameters() if p.requires_grad]
            self._optimizer, self._make_optimizer = self._make_optimizer(params), None
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: torch.optim.Optimizer | None) -> None:
        self._optimizer, self._make_optimizer = optimizer, None

    def _infer_outputs(self) -> list[TensorSpec]:
        if any(None in spec.shape for spec in self.inputs):
            raise ExpertConfigError(f"expert {self.uid!r}: inputs with free sizes need an explicit outputs schema")
        dummy = [spec.zeros(2).to(self.device) for spec in self.inputs]
        with torch.no_grad():
            outputs = _as_list(self.module(*dummy))
        return [TensorSpec(tuple(t.shape[1:]), t.dtype) for t in outputs]

    # --- validation -------------------------------------------------------------------------

    def check_inputs(self, inputs: Sequence[object], *, nan_check: bool | None = None) -> int:
        """Validate a forward request; returns its batch size (ExpertInputError otherwise).
        ``nan_check`` defaults to the config's; False checks metadata only (no kernels run)."""
        nan_check = self.config.nan_check if nan_check is None else nan_check
        return check_tensors(self.inputs, inputs, max_batch=self.config.max_batch_size, nan_check=nan_check)

    def check_backward(
        self, inputs: Sequence[object], grad_outputs: Sequence[object], *, nan_check: bool | None = None
    ) -> int:
        """Validate a backward request (inputs and output gradients); returns its batch size."""
        nan_check = self.config.nan_check if nan_check is None else nan_check
        batch = self.check_inputs(inputs, nan_check=nan_check)
        grad_batch = check_tensors(self.outputs, grad_outputs, what="gradient", nan_check=nan_check)
        if grad_batch != batch:
            raise ExpertInputError(f"gradients have batch size {grad_batch}, inputs {batch}")
        return batch

    def _check_outputs(self, outputs: list[torch.Tensor], batch: int) -> None:
        if not all(
            spec.matches(t) and t.shape[0] == batch for spec, t in zip(self.outputs, outputs)
        ) or len(outputs) != len(self.outputs):
            got = ", ".join(f"{t.dtype}{list(t.shape)}" for t in outputs)
            want = ", ".join(spec.describe() for spec in self.outputs)
            raise ExpertConfigError(f"expert {self.uid!r} returned {got}; its schema says {want}")

    # --- compute ----------------------------------------------------------------------------

    def forward(self, inputs: Sequence[torch.Tensor], *, validate: bool = True) -> list[torch.Tensor]:
        """Outputs for a batch, without autograd, on the CPU."""
        self.settle()
        batch = self.check_inputs(inputs) if validate else inputs[0].shape[0]
        with torch.no_grad():
            outputs = _as_list(self.module(*(t.to(self.device, non_blocking=True) for t in inputs)))
        self._check_outputs(outputs, batch)
        return [t.detach().cpu() for t in outputs]

    def forward_keeping_graph(self, inputs: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], ForwardGraph]:
        """``forward`` (inputs already validated), computed with autograd: the outputs, and the
        graph a backward of the same inputs can use instead of recomputing (``backward_from_graph``)."""
        self.settle()
        batch = inputs[0].shape[0]
        parameters = {t.data_ptr() for t in self._state()}  # not module.parameters(): a walk of the module
        saved = [0]

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.data_ptr() not in parameters:  # parameters are held anyway: not the graph's cost
                saved[0] += tensor.nelement() * tensor.element_size()
            return tensor

        leaves = [t.to(self.device).detach().requires_grad_(t.is_floating_point()) for t in inputs]
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            outputs = _as_list(self.module(*leaves))
        self._check_outputs(outputs, batch)
        graph = ForwardGraph(list(inputs), leaves, outputs, self.state_fingerprint(), saved[0])
        return [t.detach().cpu() for t in outputs], graph

    def state_fingerprint(self) -> tuple:
        """What a forward's result depends on besides its inputs: the update count, the training
        mode, and the identity and version counter of every parameter and buffer. Torch bumps a
        tensor's version on every in-place change (an optimizer step, ``load_state_dict``'s
        copy, a replica's import), and replacing a parameter changes its identity: an equal
        fingerprint means the module computes what it computed when the fingerprint was taken.
        (Taken several times a call: the module's tensors are listed once, and listed again only
        when a submodule, parameter or buffer was added, removed or replaced.)"""
        tensors = self._state()
        return (self.updates, self._step_owed, self.module.training, self._state_ids, tuple(map(_VERSION, tensors)))

    def _state(self) -> list[torch.Tensor]:
        """The module's parameters and buffers, listed again only when its layout changed."""
        layout = self._layout
        # a listcomp and C maps, no generator: this runs a few times on every call's path
        if layout is None or [[*map(id, table.values())] for table in self._tables] != layout:
            self._tables = [table for module in self.module.modules()
                            for table in (module._modules, module._parameters, module._buffers)]
            self._layout = [[*map(id, table.values())] for table in self._tables]
            self._held = [list(table.values()) for table in self._tables]  # so that no id seen is reused meanwhile
            self._state_tensors = list(chain(self.module.parameters(), self.module.buffers()))
            self._state_ids = tuple(map(id, self._state_tensors))
        return self._state_tensors

    def backward(
        self,
        inputs: Sequence[torch.Tensor],
        grad_outputs: Sequence[torch.Tensor],
        *,
        validate: bool = True,
        defer_step: bool = False,
        sender: object = None,
        refuse_clipped: bool = False,
        parts: int = 1,
    ) -> list[torch.Tensor]:
        """Gradients of the inputs (zeros for non-float inputs), on the CPU; then one optimizer
        step (owed, and applied by ``settle()``, with ``defer_step``). Nothing is changed if it
        raises before the step."""
        self.settle()
        batch = self.check_backward(inputs, grad_outputs) if validate else inputs[0].shape[0]
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        leaves = [
            t.to(self.device).detach().requires_grad_(t.is_floating_point()) for t in inputs
        ]
        with torch.enable_grad():
            outputs = _as_list(self.module(*leaves))
            self._check_outputs(outputs, batch)
        return self._backward(leaves, outputs, grad_outputs, defer_step, sender, refuse_clipped, parts)

    def backward_from_graph(
        self, graph: ForwardGraph, grad_outputs: Sequence[torch.Tensor], *, defer_step: bool = False,
        sender: object = None, refuse_clipped: bool = False,
    ) -> list[torch.Tensor]:
        """``backward`` of ``graph.inputs`` through the kept graph instead of a recomputed forward.
        The caller checks ``graph.state == state_fingerprint()`` first (ExpertConfigError if not:
        the result would be stale). A graph is used once."""
        self.settle()
        if graph.state != self.state_fingerprint():
            raise ExpertConfigError(f"expert {self.uid!r}: the kept forward is stale")
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        return self._backward(graph.leaves, graph.outputs, grad_outputs, defer_step, sender, refuse_clipped)

    def _bound_gradients(self, sender: object, refuse_clipped: bool, parts: int = 1) -> None:
        """Hold the parameter gradient to the learned bound before any step sees it: clip it, or
        raise GradientRefusedError (gross; or any clip with ``refuse_clipped``: a batch of
        several trainers whose culprit must be found, or a trainer too new to this volunteer to be
        given the benefit of a clip) with nothing changed. Keeps the state to
        go back to before a clipped gradient or a warm-up one is taken. ``parts``: the requests
        the batch joined; their gradients add up, so the bound, per request, is judged on the
        norm per request (a trainer's calls batched under load are not one huge gradient)."""
        if self.optimizer is None:
            return
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if not grads:
            return
        norm = gradient_norm(grads) / max(1, parts)
        if self.grad_bound.warming_up:
            self.grad_bound.seed(self._moment_norm())  # a state with a history knows its scale
            if self.grad_bound.warming_up:
                self.keep_state()  # still none: what a late-found outlier is undone to
        check = self.grad_bound.check(norm)
        self.last_check = check
        refuse = check.verdict is Verdict.GROSS or (check.verdict is Verdict.CLIPPED and refuse_clipped)
        if refuse:
            self.optimizer.zero_grad(set_to_none=True)
            shown = f"{norm:.3g}" if math.isfinite(norm) else "not finite"
            raise GradientRefusedError(
                f"gradient norm {shown} is past expert {self.uid!r}'s bound {check.bound:.3g}"
                + ("" if check.verdict is Verdict.GROSS else " (not applied: a clip is for known trainers alone)"),
                norm=norm, bound=check.bound, gross=check.verdict is Verdict.GROSS,
            )
        if check.verdict is Verdict.CLIPPED:
            self.keep_state()
            torch._foreach_mul_(grads, check.scale)
            self.suspect = True
        self.grad_bound.taken(check, sender)

    def _moment_norm(self) -> float | None:
        """The root-mean-square gradient norm Adam's second moments remember (bias-corrected),
        or None without them (a fresh optimizer, or another kind)."""
        total, seen = 0.0, False
        optimizer = self.optimizer
        if optimizer is None:
            return None
        for group in optimizer.param_groups:
            beta2 = group.get("betas", (0.9, 0.999))[1]
            for param in group["params"]:
                state = optimizer.state.get(param, {})
                if "exp_avg_sq" not in state or "step" not in state:
                    continue
                step = float(state["step"])
                if step < 1:
                    continue
                total += float(state["exp_avg_sq"].sum()) / (1 - beta2**step)
                seen = True
        return math.sqrt(total) if seen and total > 0 else None

    def reset_moments(self) -> None:
        """Forget the optimizer's moment estimates (a gradient found gross after the fact was in
        them); the parameters stay."""
        if self.optimizer is not None:
            self.optimizer.state.clear()

    # --- the state to go back to (a trainer refused for cause) --------------------------------

    @property
    def keeps_state(self) -> bool:
        """Whether a state to go back to is kept."""
        return self._kept_state is not None

    def keep_state(self) -> None:
        """Keep the current parameters and optimizer state (settled: an owed step is the one being
        judged, so it is not applied first), unless a state is kept already."""
        if self._kept_state is None:
            self._kept_state = {
                "module": copy.deepcopy(self.module.state_dict()),
                "optimizer": copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None,
            }

    def release_state(self) -> None:
        """Drop the kept state (nothing to undo any more)."""
        self._kept_state = None
        self.suspect = False

    def roll_back(self) -> bool:
        """Go back to the kept state, dropping an owed step; the update count stays (versions
        never go back). False if no state was kept."""
        kept, self._kept_state = self._kept_state, None
        self.suspect = False
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self._step_owed = False
        if kept is None:
            return False
        self.module.load_state_dict(kept["module"])
        if self.optimizer is not None and kept["optimizer"] is not None:
            self.optimizer.load_state_dict(kept["optimizer"])
        return True

    def _backward(
        self, leaves, outputs, grad_outputs, defer_step: bool, sender: object = None, refuse_clipped: bool = False,
        parts: int = 1,
    ) -> list[torch.Tensor]:
        pairs = []
        for index, (out, grad) in enumerate(zip(outputs, grad_outputs)):
            if grad.shape != out.shape:
                raise ExpertInputError(f"gradient {index} has shape {list(grad.shape)}, the output {list(out.shape)}")
            if out.requires_grad:
                pairs.append((out, grad.to(self.device, non_blocking=True)))
        if pairs:
            with torch.enable_grad():
                torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        grads = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]
        self._bound_gradients(sender, refuse_clipped, parts)
        if defer_step:
            self.updates += 1  # counted now: whoever reads it sees what a settled backend will say
            self._step_owed = True
        else:
            self._step()
        return [g.detach().cpu() for g in grads]

    @property
    def step_owed(self) -> bool:
        """Whether a deferred optimizer step waits for ``settle()``."""
        return self._step_owed

    def settle(self) -> None:
        """Apply a deferred optimizer step, if one is owed (a no-op otherwise)."""
        if self._step_owed:
            self._step_owed = False
            self._apply_step()

    def _step(self) -> None:
        self.updates += 1
        self._apply_step()

    def _apply_step(self) -> None:
        if self.optimizer is not None:
            if self.config.max_grad_norm is not None:
                nn.utils.clip_grad_norm_(self.module.parameters(), self.config.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        every = self.config.checkpoint_every
        if self.checkpoint_path is not None and every and self.updates - self._saved_at >= every:
            self.save_checkpoint()

    # --- metadata and checkpoints -----------------------------------------------------------------

    def info(self) -> dict:
        """Msgpack-able metadata for the expert-info reply (RemoteExpert learns schemas from it)."""
        return {
            "uid": self.uid,
            "class": self.expert_class,
            "hidden_dim": self.hidden_dim,
            "inputs": [spec.to_dict() for spec in self.inputs],
            "outputs": [spec.to_dict() for spec in self.outputs],
            "max_batch": self.config.max_batch_size,
            "updates": self.updates,
        }

    def state_dict(self) -> dict:
        """Everything a checkpoint holds (tensors and plain Python values only)."""
        self.settle()
        return {
            "format": CHECKPOINT_FORMAT,
            "uid": self.uid,
            "class": self.expert_class,
            "hidden_dim": self.hidden_dim,
            "updates": self.updates,
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``'s output; ExpertConfigError if it belongs to another expert."""
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ExpertConfigError("not a volunteer expert checkpoint (or a newer format)")
        self.settle()
        for key, mine in (("class", self.expert_class), ("hidden_dim", self.hidden_dim)):
            if state.get(key) != mine:
                raise ExpertConfigError(f"checkpoint has {key} {state.get(key)!r}, this expert {mine!r}")
        try:
            self.module.load_state_dict(state["module"])
            if self.optimizer is not None and state.get("optimizer") is not None:
                self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise ExpertConfigError(f"checkpoint does not fit expert {self.uid!r}: {exc}") from exc
        updates = state.get("updates")
        if type(updates) is not int or updates < 0:
            raise ExpertConfigError(f"checkpoint has a bad update count {updates!r}")
        self.updates = self._saved_at = updates
        self.release_state()  # a state loaded whole replaces what a rollback would go back to

    def save_checkpoint(self, path: str | os.PathLike | None = None) -> Path:
        """Write a checkpoint (atomic, checksummed, previous generation kept); returns its path."""
        target = Path(path) if path is not None else self.checkpoint_path
        if target is None:
            raise ExpertConfigError(f"expert {self.uid!r} has no checkpoint path")
        write_checkpoint(target, self.state_dict())
        self._saved_at = self.updates
        self.last_checkpoint_time = time.time()
        return target

    def load_checkpoint(self, path: str | os.PathLike | None = None) -> bool:
        """Load the newest good generation of a checkpoint (False if there is none). Corrupt
        files are moved aside with a warning; unsafe pickles are refused."""
        source = Path(path) if path is not None else self.checkpoint_path
        if source is None:
            return False
        state = load_latest(source, map_location=self.device)
        if state is None:
            return False
        try:
            self.load_state_dict(state)
        except ExpertConfigError as exc:  # a leftover of another expert: name the file and the way out
            raise ExpertConfigError(
                f"checkpoint {source} does not fit expert {self.uid!r} ({exc}); move that file aside to start "
                "the expert afresh, or give --checkpoints DIR another directory"
            ) from None
        return True

    @property
    def dirty(self) -> bool:
        """Whether updates happened since the last checkpoint."""
        return self.updates != self._saved_at


def make_backend(
    uid: str,
    expert_class: str,
    hidden_dim: int,
    *,
    config: ExpertsConfig = DEFAULT_CONFIG,
    checkpoint_dir: str | os.PathLike | None = None,
    optimizer: OptimizerFactory | None = None,
) -> ExpertBackend:
    """Build a registered expert class, and resume from ``checkpoint_dir/<uid>.pt`` if it exists."""
    cls = get_expert_class(expert_class)
    module = cls.build(hidden_dim)
    path = Path(checkpoint_dir) / f"{uid}.pt" if checkpoint_dir is not None else None
    backend = ExpertBackend(
        uid,
        module,
        inputs=cls.inputs(hidden_dim),
        outputs=cls.outputs(hidden_dim) if cls.outputs is not None else None,
        optimizer=optimizer,
        config=config,
        checkpoint_path=path,
        expert_class=expert_class,
        hidden_dim=hidden_dim,
    )
    backend.load_checkpoint()
    return backend
