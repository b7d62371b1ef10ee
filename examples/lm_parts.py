"""The pieces of examples/train_lm.py that need no swarm: the corpus (the Python standard
library's own sources), the byte-level transformer whose feed-forward blocks are mixtures of
experts, the local mixture that stands in for the remote one (``--local``), validation bits per
byte, sampling, and the curves (saved as JSON, drawn with matplotlib).

The local mixture is the remote one's arithmetic on local modules: the same gate (a Linear scoring
each grid dimension, an expert's score the sum of its coordinates'), the same top-k and softmax
over the chosen experts, the same expert class, and each expert with its own Adam at the
volunteers' learning rate, stepping only after a step that called it, as a volunteer's steps on
each backward it gets. The trainer's parameters (embeddings, attention, gates, head) are created
in the same order from the same seed in both modes, and the experts' first weights come from
their own seed (``initial_experts``; the example's testnet volunteers resume from them as
checkpoints), so the two runs differ only in what the wire does to the tensors.
"""

from __future__ import annotations

import itertools
import json
import math
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from volunteer.experts.backend import default_optimizer
from volunteer.experts.config import DEFAULT_CONFIG
from volunteer.experts.layers import get_expert_class

VOCAB = 256  # bytes
EXPERT_LR = DEFAULT_CONFIG.learning_rate  # what a volunteer's Adam steps its experts with
VALIDATION_EVERY = 10  # every tenth file (in sorted order) is held out for validation


@dataclass(frozen=True)
class Size:
    """One model and run size: widths, layers, grid, batch and the run's length."""

    width: int
    layers: int  # transformer blocks, each with one mixture of experts as its feed-forward block
    grid: tuple[int, ...]  # experts per mixture, as a grid (Learning@home's product keys)
    k: int  # experts per token (k_best; k_min is the same: every chosen expert answers)
    context: int  # bytes per sequence
    batch: int  # sequences per step
    steps: int
    eval_every: int
    lr: float  # the trainer's Adam (embeddings, attention, gates, head)
    train_bytes: int  # the slice of the training files used
    val_windows: int  # validation sequences (fixed, evenly spaced over the held-out files)

    @property
    def heads(self) -> int:
        return max(1, self.width // 32)

    @property
    def experts(self) -> int:
        return math.prod(self.grid)


SIZES = {
    # the integration test's: a few dozen steps in well under a minute
    "tiny": Size(width=32, layers=2, grid=(4,), k=2, context=32, batch=8, steps=40, eval_every=10, lr=3e-3,
                 train_bytes=1 << 20, val_windows=32),
    # the default: a few minutes on two CPU cores, through a local testnet
    "small": Size(width=128, layers=2, grid=(4,), k=2, context=128, batch=8, steps=1200, eval_every=100, lr=3e-3,
                  train_bytes=8 << 20, val_windows=64),
    "medium": Size(width=256, layers=4, grid=(8,), k=2, context=256, batch=16, steps=2000, eval_every=200, lr=1e-3,
                   train_bytes=16 << 20, val_windows=128),
    # a GPU's
    "large": Size(width=512, layers=4, grid=(4, 4), k=2, context=512, batch=32, steps=5000, eval_every=250,
                  lr=6e-4, train_bytes=64 << 20, val_windows=256),
}


# --- the corpus -------------------------------------------------------------------------------
def stdlib_files(root: str | None = None) -> list[Path]:
    """The standard library's ``.py`` files in sorted order (site-packages left out: what is
    installed differs from machine to machine)."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(p for p in base.rglob("*.py") if "site-packages" not in p.parts and p.is_file())


@dataclass
class Corpus:
    """Training bytes and held-out validation bytes, as uint8 tensors."""

    train: torch.Tensor
    val: torch.Tensor
    train_files: int
    val_files: int

    @classmethod
    def load(cls, train_bytes: int, val_bytes: int, root: str | None = None) -> "Corpus":
        """Every ``VALIDATION_EVERY``-th file is held out; the first ``train_bytes`` of the
        others, concatenated in sorted order, are the training set, and the first ``val_bytes``
        of the held-out ones the validation set: the same on every run of this machine's Python."""
        train, val = bytearray(), bytearray()
        n_train = n_val = 0
        for i, path in enumerate(stdlib_files(root)):
            held_out = i % VALIDATION_EVERY == VALIDATION_EVERY - 1
            into, limit = (val, val_bytes) if held_out else (train, train_bytes)
            if len(into) >= limit:
                if len(train) >= train_bytes and len(val) >= val_bytes:
                    break
                continue
            try:
                into += path.read_bytes()
            except OSError:
                continue
            if held_out:
                n_val += 1
            else:
                n_train += 1
        if len(train) < 4096 or len(val) < 4096:
            raise SystemExit(f"too little of the standard library found under {sysconfig.get_paths()['stdlib']}")
        as_tensor = lambda b, n: torch.frombuffer(bytearray(b[:n]), dtype=torch.uint8).clone()  # noqa: E731
        return cls(as_tensor(train, train_bytes), as_tensor(val, val_bytes), n_train, n_val)

    def batches(self, batch: int, context: int, seed: int):
        """Endless (inputs, targets) batches of random windows, drawn from their own generator
        seeded with ``seed``: the same order in every mode."""
        generator = torch.Generator().manual_seed(seed)
        span = len(self.train) - context - 1
        while True:
            starts = torch.randint(0, span, (batch,), generator=generator)
            windows = torch.stack([self.train[s : s + context + 1] for s in starts.tolist()]).long()
            yield windows[:, :-1], windows[:, 1:]

    def validation(self, windows: int, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``windows`` fixed windows evenly spaced over the validation bytes."""
        starts = torch.linspace(0, len(self.val) - context - 2, windows).long()
        data = torch.stack([self.val[s : s + context + 1] for s in starts.tolist()]).long()
        return data[:, :-1], data[:, 1:]


def expert_uids(prefix: str, grid: Sequence[int]) -> list[str]:
    """``prefix.i.j…`` of every expert of the grid, in the grid's order."""
    return [prefix + "".join(f".{c}" for c in coords) for coords in itertools.product(*(range(g) for g in grid))]


def initial_experts(expert_class: str, width: int, uids: Sequence[str], seed: int) -> dict[str, nn.Module]:
    """Every expert's first weights, each drawn from its own generator (``seed`` and its index),
    apart from the global one: the local run's experts, and the testnet volunteers' first
    checkpoints (``write_checkpoints``), so both runs start from the same experts."""
    built = {}
    with torch.random.fork_rng(devices=[]):
        for i, uid in enumerate(uids):
            torch.manual_seed(seed * 1_000_003 + i)
            built[uid] = get_expert_class(expert_class).build(width)
    return built


def write_checkpoints(experts: dict[str, nn.Module], expert_class: str, width: int, directory: Path) -> None:
    """Write each expert as the checkpoint a volunteer hosting it resumes from (``make_backend``
    loads ``<checkpoint dir>/<uid>.pt`` when it exists): fresh optimizer, no updates yet."""
    from volunteer.experts.backend import make_backend

    directory.mkdir(parents=True, exist_ok=True)
    for uid, module in experts.items():
        backend = make_backend(uid, expert_class, width, checkpoint_dir=directory)
        backend.module.load_state_dict(module.state_dict())
        backend.save_checkpoint()


# --- the model --------------------------------------------------------------------------------
class LocalMixture(nn.Module):
    """``RemoteMixtureOfExperts``' arithmetic on local expert modules (``--local``), ``experts`` in
    the grid's order (``initial_experts``)."""

    def __init__(self, width: int, grid: Sequence[int], k: int, experts: Sequence[nn.Module]) -> None:
        super().__init__()
        self.grid_size = tuple(grid)
        self.k = k
        self.gate = nn.Linear(width, sum(self.grid_size))  # where RemoteMixtureOfExperts makes its gate
        self.register_buffer("coords", torch.tensor(list(itertools.product(*(range(g) for g in grid)))), persistent=False)
        if len(experts) != len(self.coords):
            raise ValueError(f"{len(experts)} experts for a grid of {len(self.coords)}")
        self.experts = nn.ModuleList(experts)
        self.optimizers = [default_optimizer(e.parameters(), EXPERT_LR) for e in self.experts]
        self.called: set[int] = set()  # experts that got samples since the last step_experts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        scores = self.gate(flat).split(self.grid_size, dim=-1)
        expert_scores = sum(s[:, self.coords[:, d]] for d, s in enumerate(scores))  # [tokens, experts]
        chosen = torch.zeros_like(expert_scores, dtype=torch.bool)
        chosen.scatter_(1, expert_scores.detach().topk(min(self.k, len(self.experts)), dim=-1).indices, True)
        weights = torch.softmax(expert_scores.masked_fill(~chosen, float("-inf")), dim=-1) * chosen
        result = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            idx = chosen[:, e].nonzero().flatten()
            if len(idx):
                if torch.is_grad_enabled():
                    self.called.add(e)
                result = result.index_add(0, idx, expert(flat[idx]) * weights[idx, e, None])
        return result.reshape(*lead, -1)

    def step_experts(self) -> None:
        """Each expert called since the last step takes its own optimizer step, as on a volunteer."""
        for e in sorted(self.called):
            self.optimizers[e].step()
            self.optimizers[e].zero_grad(set_to_none=True)
        self.called.clear()


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention on the trainer, then the mixture of
    experts as the feed-forward block (the expert's own residual and norm inside)."""

    def __init__(self, width: int, heads: int, mixture: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mixture = mixture()  # either kind draws only its gate from the global generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mixture(self.norm2(x))


class ByteLM(nn.Module):
    """Byte embeddings and positions, ``size.layers`` blocks, a norm and the byte head.
    ``mixture(layer)`` makes each block's mixture (called in order, after the block's attention
    is created: the global generator's stream is the same whatever it returns)."""

    def __init__(self, size: Size, mixture: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.context = size.context
        self.embed = nn.Embedding(VOCAB, size.width)
        self.position = nn.Embedding(size.context, size.width)
        blocks = [Block(size.width, size.heads, lambda layer=layer: mixture(layer)) for layer in range(size.layers)]
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(size.width)
        self.head = nn.Linear(size.width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @property
    def mixtures(self) -> list[nn.Module]:
        return [block.mixture for block in self.blocks]

    def trainer_parameters(self) -> list[nn.Parameter]:
        """Every parameter the trainer's optimizer steps: all but local experts' (those step
        with their own optimizers, as on volunteers)."""
        local_experts = {id(p) for m in self.mixtures if isinstance(m, LocalMixture) for p in m.experts.parameters()}
        return [p for p in self.parameters() if id(p) not in local_experts]


def bits_per_byte(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch: int) -> float:
    """Mean cross-entropy over the validation windows, in bits per byte."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(inputs), batch):
            logits = model(inputs[i : i + batch])
            total += F.cross_entropy(logits.reshape(-1, VOCAB), targets[i : i + batch].reshape(-1), reduction="sum").item()
            count += targets[i : i + batch].numel()
    model.train(was_training)
    return total / count / math.log(2)


def sample(model: nn.Module, prompt: bytes, length: int, *, temperature: float = 0.8, seed: int = 0,
           device: str = "cpu") -> bytes:
    """``length`` bytes generated after ``prompt`` (temperature sampling, its own generator)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = list(prompt)
    model.eval()
    with torch.no_grad():
        for _ in range(length):
            context = torch.tensor([tokens[-model.context :]], device=device)
            logits = model(context)[0, -1].float().cpu() / temperature
            tokens.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)))
    model.train()
    return bytes(tokens[len(prompt) :])


# --- curves -----------------------------------------------------------------------------------
@dataclass
class Curve:
    """Validation bits per byte after each evaluated step, with what produced it."""

    label: str
    steps: list[int]
    bpb: list[float]
    settings: dict

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Curve":
        data = json.loads(Path(path).read_text())
        return cls(data["label"], list(data["steps"]), [float(b) for b in data["bpb"]], dict(data.get("settings", {})))

    def at(self, step: int) -> float | None:
        """The figure at ``step``, if that step was evaluated."""
        return dict(zip(self.steps, self.bpb)).get(step)


def plot(curves: Sequence[Curve], path: str | Path, title: str) -> None:
    """Draw the curves into ``path`` (matplotlib: the ``examples`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib (pip install 'volunteer[examples]'): {exc}") from exc
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for curve in curves:
        ax.plot(curve.steps, curve.bpb, marker="o", markersize=3, label=curve.label)
    ax.set_xlabel("step")
    ax.set_ylabel("validation bits per byte")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
