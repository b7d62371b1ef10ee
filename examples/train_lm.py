"""Train a byte-level mixture-of-experts language model on the Python standard library's sources,
its feed-forward experts on volunteers, and compare it with the same model trained on one machine.

    python examples/train_lm.py                          # a local testnet: a relay + 4 volunteers
    python examples/train_lm.py --local                  # the same model, seed and data, experts local
    python examples/train_lm.py --compare --plot lm.png  # both, one after the other, and their curves
    python examples/train_lm.py --compression blockwise8_64 --save-curve b8.json   # 8-bit tensors on every link
    python examples/train_lm.py --replot --plot all.png --curve local.json --curve b8.json  # saved curves only
    python examples/train_lm.py --size medium --device cuda                        # larger, on a GPU
    python examples/train_lm.py --swarm my.toml          # a running swarm hosting the experts

The model: byte embeddings and positions, ``--size``'s blocks (small: 2 of width 128), each causal
self-attention on the trainer and then a mixture of experts as the feed-forward block (a
``RemoteMixtureOfExperts`` of ``ffn`` experts ``lm<layer>.<i>``; the gates stay on the trainer),
a norm and the byte head. Each token goes to its ``k`` best experts (small: 2 of 4 per layer),
and k_min is k: every chosen expert answers (no straggler is dropped), so the swarm computes
what one machine would, up to the wire's encoding. The volunteers' experts learn too: each
backward call steps the expert's own Adam on its volunteer. ``--local`` trains the same model
with the experts as local modules that step the same way (examples/lm_parts.py), from the same
seed and on the same batches.

The corpus: the ``.py`` files under ``sysconfig``'s stdlib path, sorted; every tenth file is held
out for validation; the first ``train_bytes`` of the others (small: 8 MiB) are the training set.
Validation bits per byte (cross-entropy over fixed windows of the held-out files) is printed
every ``eval_every`` steps, a generated sample at the end, then where the time went: the
trainer's share of the step spent in the mixtures' calls (waiting on the network and the
volunteers), the calls' network and volunteer time, and each volunteer's compute utilisation
(its runtime's compute seconds over the training's wall time). The last line is
``final: step N validation bpb X`` (``--compare``: both, and the swarm's over the local's).

--swarm: the swarm must host ``ffn`` experts of hidden dim ``width`` named ``lm0.[0:E]``,
``lm1.[0:E]``, ... (``volunteer join SWARM --experts 'ffn:lm0.[0:4],lm1.[0:4]' --hidden-dim 64``),
or declare one ``[[grid]]`` per layer (used in order).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from lm_parts import (SIZES, VOCAB, ByteLM, Corpus, Curve, LocalMixture, Size, bits_per_byte,  # noqa: E402
                      expert_uids, initial_experts, plot, sample, write_checkpoints)

from volunteer.experts.config import DEFAULT_CONFIG  # noqa: E402
from volunteer.experts.tensors import COMPRESSIONS  # noqa: E402

EXPERT_CLASS = "ffn"
EXPERTS_TIMEOUT = 120.0  # a swarm's experts must all be live within this before the first step
CALL_TIMEOUT = 60.0  # per expert call: generous, since k_min = k waits for every chosen expert
EXPERTS_SEED_OFFSET = 1000  # the experts' first weights come from seed + this, apart from the trainer's
PROMPT = b"def "
MAX_CALL_TOKENS = DEFAULT_CONFIG.max_batch_size  # a volunteer's largest request (1024 samples) by default
VAL_BYTES = 256 << 10  # of the held-out files: the validation windows spread over a dozen or so


class Testnet:
    """`volunteer testnet` in a child process hosting every layer's experts; stopping it stops
    every volunteer it started."""

    def __init__(self, n: int, size: Size, threads: int | None = None, experts_seed: int | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lm-testnet-"))
        experts = f"{EXPERT_CLASS}:" + ",".join(prefix(layer) + "".join(f".[0:{g}]" for g in size.grid)
                                                for layer in range(size.layers))
        if experts_seed is not None:
            # every volunteer resumes from a checkpoint of --local's first weights: the testnet's
            # checkpoint directories are <dir>/checkpoints-v<i>; each gets every expert's, so it
            # needs no knowledge of how the testnet deals the experts out
            first = initial_experts(EXPERT_CLASS, size.width, all_uids(size), experts_seed)
            for i in range(n):
                write_checkpoints(first, EXPERT_CLASS, size.width, self.dir / "net" / f"checkpoints-v{i}")
        env = dict(os.environ, VOLUNTEER_CONFIG_DIR=str(self.dir / "config"), PYTHONUNBUFFERED="1")
        if threads:  # each volunteer's torch threads: a few volunteers on a few cores, none spinning
            env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "volunteer", "testnet", "-n", str(n), "--experts", experts,
             "--hidden-dim", str(size.width), "--dir", str(self.dir / "net"), "--name", "lm", "--no-dashboard"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.swarm_file = self.dir / "net" / "swarm.toml"
        self.controls = [self.dir / "net" / f"v{i}.sock" for i in range(n)]
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            if "volunteers ready" in line:
                print("  " + line.rstrip(), flush=True)
                # what it prints later is read and dropped: a full pipe would stall it
                threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                return
        self.stop()
        raise RuntimeError("testnet did not start:\n" + "".join(lines))

    def compute_seconds(self) -> list[float | None]:
        """Each volunteer's compute seconds this session (its runtime's busy time), None if unreachable."""
        from volunteer.cli.control import compute_seconds

        return compute_seconds(self.controls)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)  # keys, logs and the experts' checkpoints


def prefix(layer: int) -> str:
    return f"lm{layer}"


def all_uids(size: Size) -> list[str]:
    return [uid for layer in range(size.layers) for uid in expert_uids(prefix(layer), size.grid)]


def experts_seed(args) -> int:
    """The experts' first weights' seed: apart from the trainer's, derived from --seed."""
    return args.seed + EXPERTS_SEED_OFFSET


class MixtureClock:
    """Wall seconds the trainer spends inside its mixtures, forward and backward (module hooks):
    in a swarm run, waiting on the experts' calls (network and volunteers)."""

    def __init__(self, mixtures) -> None:
        self.seconds = 0.0
        self._started: dict[int, float] = {}
        for m in mixtures:
            m.register_forward_pre_hook(self._begin)
            m.register_forward_hook(self._end)
            m.register_full_backward_pre_hook(self._begin)
            m.register_full_backward_hook(self._end)

    def _begin(self, module, *_):
        self._started[id(module)] = time.perf_counter()

    def _end(self, module, *_):
        started = self._started.pop(id(module), None)
        if started is not None:
            self.seconds += time.perf_counter() - started


def build(size: Size, swarm, args) -> ByteLM:
    """The model, its mixtures remote (``swarm``) or local (``swarm`` None), from ``args.seed``."""
    torch.manual_seed(args.seed)
    grids = list(getattr(swarm.spec, "grids", None) or []) if swarm is not None else []
    first = initial_experts(EXPERT_CLASS, size.width, all_uids(size), experts_seed(args)) if swarm is None else {}

    def mixture(layer: int):
        if swarm is None:
            return LocalMixture(size.width, size.grid, size.k, [first[u] for u in expert_uids(prefix(layer), size.grid)])
        from volunteer import RemoteMixtureOfExperts

        declared = grids[layer] if len(grids) >= size.layers else None
        return RemoteMixtureOfExperts(
            swarm, in_features=size.width, grid=declared, grid_size=size.grid, uid_prefix=prefix(layer),
            k_best=size.k, k_min=size.k, forward_timeout=CALL_TIMEOUT, backward_timeout=CALL_TIMEOUT,
            timeout_after_k_min=CALL_TIMEOUT, compression=args.compression,
        )

    return ByteLM(size, mixture).to(args.device)


def wait_for_experts(model: ByteLM, size: Size, timeout: float = EXPERTS_TIMEOUT) -> None:
    """Until every layer's experts are live in the swarm: a first step that found only some would
    route its tokens elsewhere than the local run does (a swarm whose volunteers are still joining)."""
    deadline = time.monotonic() + timeout
    while True:
        missing = sum(size.experts - len(m.live_experts(refresh=True)) for m in model.mixtures)
        if missing <= 0:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{missing} of the model's {size.layers * size.experts} experts are not live in the swarm "
                             f"after {timeout:.0f} s")
        print(f"  waiting for {missing} expert(s) to be live in the swarm", flush=True)
        time.sleep(1.0)


def train(size: Size, corpus: Corpus, swarm, args, label: str, losses_out: list | None = None) -> tuple[Curve, ByteLM, dict]:
    """Train for ``size.steps`` steps, printing validation bits per byte every ``eval_every``;
    returns the curve, the model and where the time went (``losses_out``: each step's loss appended)."""
    model = build(size, swarm, args)
    local = swarm is None
    optimizer = torch.optim.Adam(model.trainer_parameters(), lr=size.lr)
    clock = MixtureClock(model.mixtures)
    if not local:
        wait_for_experts(model, size)
    val_x, val_y = (t.to(args.device) for t in corpus.validation(size.val_windows, size.context))
    curve = Curve(label, [], [], {"size": args.size, "seed": args.seed, "compression": None if local else args.compression,
                                  "steps": size.steps, "mode": "local" if local else "swarm"})
    batches = corpus.batches(size.batch, size.context, args.seed)
    micro = max(1, MAX_CALL_TOKENS // size.context)  # sequences a forward: no expert gets more tokens than it takes
    started = time.perf_counter()
    train_s = eval_s = 0.0
    in_mixtures_train = 0.0
    losses = []
    for step in range(1, size.steps + 1):
        x, y = next(batches)
        x, y = x.to(args.device), y.to(args.device)
        step_started, mixtures_before = time.perf_counter(), clock.seconds
        optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        for i in range(0, len(x), micro):
            # a volunteer takes at most max_batch_size tokens a call: a larger step goes in
            # micro-batches, each backward stepping the experts it called (local ones as well)
            part = F.cross_entropy(model(x[i : i + micro]).reshape(-1, VOCAB), y[i : i + micro].reshape(-1))
            (part * len(x[i : i + micro]) / len(x)).backward()
            loss += part.item() * len(x[i : i + micro]) / len(x)
            for m in model.mixtures:
                if isinstance(m, LocalMixture):
                    m.step_experts()
        optimizer.step()
        train_s += time.perf_counter() - step_started
        in_mixtures_train += clock.seconds - mixtures_before
        losses.append(loss)
        if losses_out is not None:
            losses_out.append(loss)
        if step % size.eval_every == 0 or step == size.steps:
            eval_started = time.perf_counter()
            bpb = bits_per_byte(model, val_x, val_y, micro)
            eval_s += time.perf_counter() - eval_started
            curve.steps.append(step)
            curve.bpb.append(bpb)
            train_bpb = sum(losses) / len(losses) / math.log(2)
            losses.clear()
            print(f"[{label}] step {step:>5}  train {train_bpb:.3f}  validation {bpb:.4f} bits/byte  "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    timing = {"wall_s": time.perf_counter() - started, "train_s": train_s, "eval_s": eval_s,
              "in_mixtures_train_s": in_mixtures_train}
    return curve, model, timing


def report_time(timing: dict, model: ByteLM, volunteers: list[float] | None, local: bool, steps: int) -> None:
    """Where the time went: the step, the trainer's share in the mixtures, the calls and the volunteers."""
    train_s, mix_s = timing["train_s"], timing["in_mixtures_train_s"]
    what = "computing the local experts" if local else "waiting on the experts' calls (network + volunteers)"
    print(f"time: {timing['wall_s']:.0f} s in all, {train_s:.0f} s training ({train_s / steps * 1e3:.0f} ms a step), "
          f"{timing['eval_s']:.0f} s validating; the trainer spent {mix_s / max(train_s, 1e-9):.0%} of its training "
          f"steps {what}", flush=True)
    if local:
        return
    network = server = calls = 0.0
    bytes_moved = 0
    for m in model.mixtures:
        for hosts in m.stats["experts"].values():
            for h in hosts:
                calls += h["calls"]
                network += h["network_ms_per_call"] * h["calls"] / 1e3
                server += h["server_ms_per_call"] * h["calls"] / 1e3
                bytes_moved += h["bytes_out"] + h["bytes_in"]
    if calls:
        print(f"calls: {calls:.0f} answered (forwards and backwards), {network / calls * 1e3:.1f} ms on the network and "
              f"{server / calls * 1e3:.1f} ms on the volunteer per call on average ({network / (network + server):.0%} "
              f"network; calls run in parallel), {bytes_moved / 2**20:.0f} MiB of tensors", flush=True)
    counts = [m.stats for m in model.mixtures]
    print(f"mixtures: {sum(c['calls'] for c in counts)} expert calls, {sum(c['failures'] for c in counts)} failed, "
          f"{sum(c['samples_short'] for c in counts)} tokens short of k_min (zero output)", flush=True)
    if volunteers:
        shares = ", ".join("?" if v is None else f"{v / timing['wall_s']:.0%}" for v in volunteers)
        print(f"volunteers' compute utilisation (runtime compute time over the run's wall time): {shares}", flush=True)


def run(size: Size, corpus: Corpus, args, mode: str):
    """One run, ``mode`` "local" or "swarm"; returns (curve, model, timing)."""
    if mode == "local":
        curve, model, timing = train(size, corpus, None, args, "local")
        report_time(timing, model, None, True, size.steps)
        return curve, model, timing
    from volunteer import Swarm

    testnet = None
    if not args.swarm:
        print(f"starting a testnet: a relay and {args.volunteers} volunteers hosting {size.layers} x {size.experts} "
              f"{EXPERT_CLASS} experts of width {size.width}", flush=True)
        for attempt in (1, 2):  # a loaded machine's volunteers may miss the testnet's start deadline once
            try:
                testnet = Testnet(args.volunteers, size, args.threads, experts_seed(args))
                break
            except RuntimeError as exc:
                if attempt == 2:
                    raise SystemExit(str(exc)) from None
                print(f"  {str(exc).strip().splitlines()[-1]}; starting it once more", flush=True)
    try:
        with Swarm.join(args.swarm or testnet.swarm_file) as swarm:
            before = testnet.compute_seconds() if testnet else None
            curve, model, timing = train(size, corpus, swarm, args, f"swarm {args.compression}")
            volunteers = None
            if testnet is not None:
                after = testnet.compute_seconds()
                volunteers = [None if a is None or b is None else a - b for a, b in zip(after, before)]
            report_time(timing, model, volunteers, False, size.steps)
            if args.sample_bytes:
                show_sample(model, args)
    finally:
        if testnet is not None:
            testnet.stop()
    return curve, model, timing


def show_sample(model: ByteLM, args) -> None:
    text = sample(model, PROMPT, args.sample_bytes, seed=args.seed, device=args.device)
    print("sample:\n" + (PROMPT + text).decode("utf-8", errors="replace"), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", choices=list(SIZES), help="model and run size (default small)")
    parser.add_argument("--steps", type=int, help="training steps (default: the size's)")
    parser.add_argument("--eval-every", type=int, help="validate every this many steps (default: the size's)")
    parser.add_argument("--lr", type=float, help="the trainer's learning rate (default: the size's; the experts' "
                        "is the volunteers' own, 1e-3)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="the experts as local modules (no swarm)")
    mode.add_argument("--compare", action="store_true", help="train locally, then through the swarm, and compare")
    parser.add_argument("--swarm", help="join this swarm (name, file or multiaddr) instead of starting a testnet")
    parser.add_argument("--volunteers", type=int, default=4, help="volunteers of the testnet (default 4)")
    parser.add_argument("--compression", default="auto", choices=["auto", *COMPRESSIONS],
                        help="tensors on the wire: auto (what each link calls for; none on loopback) or fixed")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="the trainer's device (default: cuda when present)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1 if not torch.cuda.is_available() else 0,
                        help="torch threads of the trainer and of each testnet volunteer (default 1 on a CPU: they "
                        "share its cores, and torch's threads spin while others hold them; 0: torch's choice)")
    parser.add_argument("--sample-bytes", type=int, default=200, help="bytes to generate at the end (0: none)")
    parser.add_argument("--save-curve", metavar="FILE", help="write this run's curve as JSON (--compare: FILE's "
                        "stem with -local and -swarm)")
    parser.add_argument("--curve", action="append", default=[], metavar="FILE", help="--plot: an earlier run's "
                        "saved curve too (repeatable)")
    parser.add_argument("--plot", metavar="PNG", help="draw the validation curves (this run's and --curve's)")
    parser.add_argument("--replot", action="store_true", help="train nothing: --plot only the --curve files")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the testnet (and its volunteers) stop with us
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.replot:
        if not (args.plot and args.curve):
            parser.error("--replot needs --plot PNG and at least one --curve FILE")
        curves = [Curve.load(p) for p in args.curve]
        plot(curves, args.plot, f"byte-level MoE LM on the stdlib ({curves[0].settings.get('size', '?')} size)")
        print(f"plot: {args.plot}", flush=True)
        return 0
    size = SIZES[args.size]
    overrides = {k: v for k, v in (("steps", args.steps), ("eval_every", args.eval_every), ("lr", args.lr)) if v}
    if overrides:
        size = Size(**{**size.__dict__, **overrides})
    if args.threads:
        torch.set_num_threads(args.threads)

    corpus_started = time.perf_counter()
    corpus = Corpus.load(size.train_bytes, VAL_BYTES)
    print(f"corpus: {len(corpus.train) / 2**20:.1f} MiB from {corpus.train_files} standard-library files, "
          f"validation {len(corpus.val) / 2**10:.0f} KiB from {corpus.val_files} held-out files "
          f"({time.perf_counter() - corpus_started:.1f} s)", flush=True)
    print(f"model: {size.layers} blocks of width {size.width}, {size.experts} experts a block (top {size.k}), context "
          f"{size.context}, batch {size.batch}, {size.steps} steps", flush=True)

    modes = ["local", "swarm"] if args.compare else ["local"] if args.local else ["swarm"]
    curves = {}
    for m in modes:
        curves[m], model, _ = run(size, corpus, args, m)
        if m == "local" and not args.compare and args.sample_bytes:
            show_sample(model, args)
    if args.save_curve:
        for m, curve in curves.items():
            path = Path(args.save_curve)
            curve.save(path.with_name(f"{path.stem}-{m}{path.suffix}") if args.compare else path)
    if args.plot:
        drawn = [*curves.values(), *(Curve.load(p) for p in args.curve)]
        plot(drawn, args.plot, f"byte-level MoE LM on the stdlib ({args.size}, seed {args.seed})")
        print(f"plot: {args.plot}", flush=True)
    for m, curve in curves.items():
        print(f"final: {curve.label} step {curve.steps[-1]} validation bpb {curve.bpb[-1]:.4f}", flush=True)
    if args.compare:
        local, swarm = curves["local"].bpb[-1], curves["swarm"].bpb[-1]
        print(f"compare: swarm {swarm:.4f} vs local {local:.4f} bits/byte at step {size.steps}: "
              f"{(swarm / local - 1) * 100:+.2f} %", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
