"""Expert classes: the built-in ``ffn`` and ``transformer``, and a registry for custom ones.

A custom expert is a Python file the volunteer points to (``load_expert_file(path)``) holding a
class, or a function, that takes ``hidden_dim`` and returns an ``nn.Module``, decorated with
``register_expert``::

    import torch
    from volunteer.experts import TensorSpec, register_expert

    @register_expert("gated", inputs=lambda h: [TensorSpec((h,))])   # inputs: the default
    class Gated(torch.nn.Module):
        def __init__(self, hidden_dim):
            super().__init__()
            self.gate = torch.nn.Linear(hidden_dim, hidden_dim)
        def forward(self, x):
            return x * torch.sigmoid(self.gate(x))

``inputs``/``outputs`` map ``hidden_dim`` to TensorSpecs (sizes after the batch dim). Inputs
default to one float32 ``[batch, hidden_dim]``; outputs are found by running a dummy batch,
which needs fixed sizes: an expert whose inputs have a free (``None``) size must give
``outputs``. The module must be deterministic (no dropout): backward may recompute the forward.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ExpertConfigError
from .schema import TensorSpec

SpecsFor = Callable[[int], Sequence[TensorSpec]]
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ExpertClass:
    """A registered expert class: how to build its module and its schema for a ``hidden_dim``."""

    name: str
    factory: Callable[[int], nn.Module]
    inputs: SpecsFor
    outputs: SpecsFor | None  # None: found by a dummy forward
    source: str  # "builtin" or the file that registered it

    def build(self, hidden_dim: int) -> nn.Module:
        """A fresh module; ExpertConfigError if the factory fails or returns no nn.Module."""
        if type(hidden_dim) is not int or hidden_dim < 1:
            raise ExpertConfigError(f"hidden_dim must be a positive integer, got {hidden_dim!r}")
        try:
            module = self.factory(hidden_dim)
        except Exception as exc:
            raise ExpertConfigError(f"expert class {self.name!r} failed to build: {exc}") from exc
        if not isinstance(module, nn.Module):
            raise ExpertConfigError(f"expert class {self.name!r} returned {type(module).__name__}, not an nn.Module")
        return module


_registry: dict[str, ExpertClass] = {}
_lock = threading.Lock()
_loading: list[str] = []  # the file being loaded by load_expert_file, if any


def _default_inputs(hidden_dim: int) -> list[TensorSpec]:
    return [TensorSpec((hidden_dim,))]


def register_expert(name: str, *, inputs: SpecsFor | None = None, outputs: SpecsFor | None = None):
    """Decorator registering a class or function ``f(hidden_dim) -> nn.Module`` as expert class
    ``name``. A name can be registered once (reloading the same file replaces its own names)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ExpertConfigError(f"expert class name {name!r}: use 1-64 letters, digits, '_' or '-'")

    def decorate(factory):
        if not callable(factory):
            raise ExpertConfigError(f"@register_expert({name!r}) needs a class or function")
        source = _loading[-1] if _loading else "builtin" if factory.__module__ == __name__ else factory.__module__
        with _lock:
            old = _registry.get(name)
            if old is not None and old.source != source:
                raise ExpertConfigError(f"expert class {name!r} is already registered by {old.source}")
            _registry[name] = ExpertClass(name, factory, inputs or _default_inputs, outputs, source)
        return factory

    return decorate


def get_expert_class(name: str) -> ExpertClass:
    """The registered class ``name``; ExpertConfigError listing the known ones otherwise."""
    with _lock:
        found = _registry.get(name)
        known = sorted(_registry)
    if found is None:
        raise ExpertConfigError(f"unknown expert class {name!r}; known: {', '.join(known)}")
    return found


def expert_classes() -> list[str]:
    """Names of every registered expert class."""
    with _lock:
        return sorted(_registry)


def load_expert_file(path: str | os.PathLike) -> list[str]:
    """Run a custom-expert file and return the names it registered. Loading the same file again
    replaces what it registered before. ExpertConfigError if it fails or registers nothing."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise ExpertConfigError(f"custom expert file {path} does not exist")
    module_name = "volunteer_custom_" + hashlib.sha256(path.encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ExpertConfigError(f"cannot load {path} as Python code")
    with _lock:
        previous = {name: cls for name, cls in _registry.items() if cls.source == path}
        for name in previous:
            del _registry[name]
    module = importlib.util.module_from_spec(spec)
    # Registered before running, as importlib's recipe does: dataclasses, typing and pickle
    # look classes up in sys.modules by their __module__.
    sys.modules[module_name] = module
    _loading.append(path)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        with _lock:
            for name in [n for n, c in _registry.items() if c.source == path]:
                del _registry[name]
            _registry.update(previous)
        if isinstance(exc, ExpertConfigError):
            raise
        raise ExpertConfigError(f"custom expert file {path} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        _loading.pop()
    with _lock:
        names = sorted(name for name, cls in _registry.items() if cls.source == path)
    if not names:
        raise ExpertConfigError(f"{path} registers no expert: decorate a class with @register_expert(\"name\")")
    return names


# --- built-in experts -------------------------------------------------------------------------


@register_expert("ffn")
class FeedForward(nn.Module):
    """Post-norm residual feed-forward block: ``LayerNorm(x + W2 gelu(W1 x))`` with a 4x hidden
    layer (Learning@home's ffn expert). Input and output: float32 ``[batch, hidden_dim]``."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden_dim, 4 * hidden_dim)
        self.down = nn.Linear(4 * hidden_dim, hidden_dim)
        self.norm = nn.LayerNorm(hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``LayerNorm(x + ffn(x))``: the norm keeps stacked mixture layers at a steady scale."""
        return self.norm(x + self.down(F.gelu(self.up(x), approximate="tanh")))


def _sequence(hidden_dim: int) -> list[TensorSpec]:
    return [TensorSpec((None, hidden_dim))]


def default_heads(hidden_dim: int) -> int:
    """Attention heads for a width: about one per 64 features, dividing ``hidden_dim``."""
    heads = max(1, hidden_dim // 64)
    while hidden_dim % heads:
        heads -= 1
    return heads


@register_expert("transformer", inputs=_sequence, outputs=_sequence)
class TransformerBlock(nn.Module):
    """Pre-norm transformer encoder block without dropout: ``x + attn(LN x)``, then
    ``x + ffn(LN x)``. Input and output: float32 ``[batch, sequence, hidden_dim]``; sequences of
    different lengths are batched separately."""

    def __init__(self, hidden_dim: int, heads: int | None = None) -> None:
        super().__init__()
        self.heads = heads or default_heads(hidden_dim)
        if hidden_dim % self.heads:
            raise ExpertConfigError(f"{self.heads} heads do not divide hidden_dim {hidden_dim}")
        self.norm1 = nn.LayerNorm(hidden_dim)
        self.qkv = nn.Linear(hidden_dim, 3 * hidden_dim)
        self.proj = nn.Linear(hidden_dim, hidden_dim)
        self.norm2 = nn.LayerNorm(hidden_dim)
        self.up = nn.Linear(hidden_dim, 4 * hidden_dim)
        self.down = nn.Linear(4 * hidden_dim, hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Self-attention over the sequence dim, then the feed-forward layer; both residual."""
        batch, length, width = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, width // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [batch, heads, length, head_dim]
        attended = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))
