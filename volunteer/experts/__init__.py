"""Experts, in two sides over a shared core.

- **The shared core**, re-exported here: the expert classes (``layers``), the config, tensor
  specs and the tensor wire format (``schema``, ``tensors``), the call protocol's framing
  (``protocol``), error replies (``failures``), receipts, a host's ``Standing`` and the
  ``distance`` between two states.
- **The volunteer side** (import from its modules): backends (``backend``: module + optimizer +
  schema + checkpoints), the batching ``runtime`` and its scheduler, the ``server`` handler.
  ``volunteer.replicas`` builds on it.
- **The trainer side** (import from its modules): ``client`` (``RemoteExpert``, ``call_expert``),
  the mixture (``moe``), ``audit``, ``comparison``, ``guard``, ``trust`` and the ``loop`` that
  runs them for synchronous code.

Either side imports the core and never the other (an import-linter contract in pyproject.toml
says so), so this package re-exports neither: importing ``volunteer.experts.backend`` loads no
trainer code, and a trainer's ``volunteer.experts.moe`` loads no runtime.
"""

from .config import DEFAULT_CONFIG, ExpertsConfig
from .distance import distance
from .failures import from_failure, raise_remote, to_failure
from .layers import (
    ExpertClass,
    FeedForward,
    TransformerBlock,
    expert_classes,
    get_expert_class,
    load_expert_file,
    register_expert,
)
from .protocol import protocol_id
from .schema import TensorSpec
from .standing import Standing
from .tensors import COMPRESSIONS, TensorReader, deserialize, encode, pick_compression, serialize

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_CONFIG",
    "ExpertClass",
    "ExpertsConfig",
    "FeedForward",
    "Standing",
    "TensorReader",
    "TensorSpec",
    "TransformerBlock",
    "deserialize",
    "distance",
    "encode",
    "expert_classes",
    "from_failure",
    "get_expert_class",
    "load_expert_file",
    "pick_compression",
    "protocol_id",
    "raise_remote",
    "register_expert",
    "serialize",
    "to_failure",
]
