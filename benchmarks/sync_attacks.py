"""The sync guard under attack: two colluding fresh identities in an expert's sync group, on the
pure guard (``volunteer/replicas/guard.py``, no network), against honest replicas that train
between rounds.

    python benchmarks/sync_attacks.py                 # 20 rounds, 3 seeds (about 15 s)
    python benchmarks/sync_attacks.py --rounds 40

Honest replicas take noisy steps of one honest drift (``DRIFT``, L2) a round: independent from
round to round, or with momentum 0.7 (the velocity's noise scaled so a step is still about one
drift). Groups: one honest replica among three (two colluders), two honest among four (the
honest pair vouched for each other, as replicas that caught up from each other). The colluders
see each honest replica's parameters and offer it, each, those parameters moved along the
attack plus a drift of noise of their own (so their differences wander like an honest
replica's). Every honest replica has a twin in a world without colluders that takes the same
steps; the figure is how far the attack moved it from its twin, in the attack's plane, in
honest drifts (the larger of the two honest replicas of four), the median over the seeds; in
brackets the bound the honest replica applies at the end, in drifts (it must not ratchet up).

Standing comes from lineage only (``guard.py``): a peer is weighed when we loaded its state,
never for rounds of looking honest, so the colluders, fresh, are never weighed; the figures
show what is left (0.0: nothing). The second table runs the same attacks by two colluders the
honest replicas loaded their state from (a catch-up source that lies, or copied the honest state
to be one): they have standing, and only the bias test and the pull budgets hold them.

The honest control: honest groups of 2, 3 and 4 with no colluder and how far apart they are after
each round (the largest pairwise distance, in drifts): *vouched*, each loaded the others' state
(worst round); *lineage*, as catch-ups make them, the first replica is the root, each other one
loaded the root's state, corroborated by the one before it (worst round); *fresh*, nobody loaded
anyone's (they never merge: at the end); with momentum or not, and a vouched trio whose first
replica trains ten times the others. What the lineage costs: the root never weighs its followers,
so its own training noise is never averaged with theirs: how far the root ends from the mean of
all the group's training (where a group that all merged would be), in drifts, at the end. A
newcomer that caught up from the first of two or three replicas: the rounds it merged its source,
the rounds the others merged it (never: it loaded ours, which anyone may), and how far it ends
from its source, in drifts.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from volunteer.replicas.config import ReplicasConfig  # noqa: E402
from volunteer.replicas.guard import Contributed, SyncGuard  # noqa: E402

DIM = 1000
DRIFT = 0.1
UID = "e"
MOMENTUM = 0.7


def vec(flat: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"w": flat.to(torch.float32)}


def flat(params) -> torch.Tensor:
    return params["w"].reshape(-1).to(torch.float64)


def noise(generator: torch.Generator, size: float = DRIFT) -> torch.Tensor:
    direction = torch.randn(DIM, generator=generator, dtype=torch.float64)
    return direction / direction.norm() * size


class Trainer:
    """One replica's training steps: noise of one drift a round, or its momentum average."""

    def __init__(self, seed: int, momentum: float, scale: float = 1.0) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.momentum = momentum
        self.scale = scale
        self.velocity = torch.zeros(DIM, dtype=torch.float64)

    def step(self) -> torch.Tensor:
        g = noise(self.generator, DRIFT * self.scale)
        if self.momentum <= 0:
            return g
        self.velocity = self.momentum * self.velocity + g
        return self.velocity * math.sqrt(1 - self.momentum**2)


@dataclass
class Plane:
    u: torch.Tensor
    w: torch.Tensor

    def project(self, x: torch.Tensor) -> float:
        return math.hypot(float(x @ self.u), float(x @ self.w))


# an attack: (round, the honest replica's parameters, where it started) -> the colluders' offset
Attack = Callable[[int, torch.Tensor, torch.Tensor, Plane], torch.Tensor]


def patient(rate: float, direction: Callable[[int, Plane], torch.Tensor] | None = None, after: int = 0) -> Attack:
    """Wants the honest replica ``rate`` drifts further along a direction every round (after
    ``after`` honest rounds): offers what is still missing, at most 2.5 drifts (inside the bound)."""

    def offset(round_: int, mine: torch.Tensor, origin: torch.Tensor, plane: Plane) -> torch.Tensor:
        if round_ < after:
            return torch.zeros_like(mine)
        d = plane.u if direction is None else direction(round_, plane)
        missing = rate * DRIFT * (round_ - after + 1) - float((mine - origin) @ d)
        return max(0.0, min(missing, 2.5 * DRIFT)) * d

    return offset


def fixed(size: float, direction: Callable[[int, Plane], torch.Tensor] | None = None) -> Attack:
    """Offers the honest replica's own parameters ``size`` drifts along a direction."""

    def offset(round_: int, mine: torch.Tensor, origin: torch.Tensor, plane: Plane) -> torch.Tensor:
        return size * DRIFT * (plane.u if direction is None else direction(round_, plane))

    return offset


def alternating(round_: int, plane: Plane) -> torch.Tensor:
    return plane.u if round_ % 2 == 0 else plane.w


def turning(round_: int, plane: Plane) -> torch.Tensor:
    angle = 2 * math.pi * round_ / 40
    return math.cos(angle) * plane.u + math.sin(angle) * plane.w


ATTACKS: dict[str, Attack] = {
    "push 1/2 a round": patient(0.5),
    "push 1 a round": patient(1.0),
    "push 2 a round": patient(2.0),
    "push 5 a round": patient(5.0),
    "fixed offset 2": fixed(2.0),
    "alternating 2 dirs (offset 2)": fixed(2.0, alternating),
    "turning, 40 rounds a turn (offset 2)": fixed(2.0, turning),
    "honest 10 rounds, then push 1": patient(1.0, after=10),
}


def attacked(attack: Attack, honest: int, momentum: float, seed: int, rounds: int, config: ReplicasConfig,
             lineage: bool = False) -> tuple[float, float]:
    """``honest`` replicas (vouched for each other) and two colluders for ``rounds`` rounds; how far
    the attack moved the honest replicas from their twins in its plane (the largest, in drifts)
    and the bound the first applies at the end (in drifts). ``lineage``: the honest replicas
    loaded the colluders' states (they have standing: a lying lineage)."""
    generator = torch.Generator().manual_seed(1000 + seed)
    u = noise(generator, 1.0)
    w = noise(generator, 1.0)
    w = w - (w @ u) * u
    plane = Plane(u, w / w.norm())
    colluders = [torch.Generator().manual_seed(2000 + 10 * seed + i) for i in range(2)]
    names = [f"h{i}" for i in range(honest)]
    trainers = [Trainer(100 * seed + i, momentum) for i in range(honest)]
    start = torch.randn(DIM, generator=generator, dtype=torch.float64)
    worlds = {"attacked": {n: start.clone() for n in names}, "twin": {n: start.clone() for n in names}}
    guards = {world: {n: SyncGuard(config) for n in names} for world in worlds}
    for world in guards.values():
        for name in names:
            for other in names:
                if other != name:
                    world[name].vouch(UID, other)
            if lineage and world is guards["attacked"]:
                for i in range(2):
                    world[name].vouch(UID, f"c{i}")
    origin = start.clone()
    bound = 0.0
    for round_ in range(rounds):
        steps = [t.step() for t in trainers]
        for world in worlds.values():
            for name, s in zip(names, steps):
                world[name] = world[name] + s
        for label, points in worlds.items():
            results = {}
            for name in names:
                claims = [Contributed(o, 1, vec(points[o])) for o in names if o != name]
                if label == "attacked":
                    lie = points[name] + attack(round_, points[name], origin, plane)
                    claims += [Contributed(f"c{i}", 1, vec(lie + noise(g))) for i, g in enumerate(colluders)]
                verdict = guards[label][name].decide(UID, vec(points[name]), 1, claims)
                results[name] = flat(verdict.parameters)
                if label == "attacked" and name == names[0]:
                    bound = verdict.bound
            worlds[label] = results
    moved = max(plane.project(worlds["attacked"][n] - worlds["twin"][n]) for n in names)
    return moved / DRIFT, bound / DRIFT


def spread(points: dict[str, torch.Tensor]) -> float:
    values = list(points.values())
    return max(
        (float((a - b).norm()) for i, a in enumerate(values) for b in values[i + 1 :]), default=0.0
    ) / DRIFT


def honest_group(size: int, momentum: float, seed: int, rounds: int, config: ReplicasConfig, standing: str,
                 fast: bool = False) -> tuple[list[float], float]:
    """An honest group's largest pairwise distance after each round, in drifts, and how far its
    first replica ends from the mean of all the group's training (in drifts). ``standing``:
    vouched (everyone loaded everyone's state), lineage (the others loaded the first's,
    corroborated by the one before them) or fresh (nobody loaded anything)."""
    names = [f"h{i}" for i in range(size)]
    trainers = [Trainer(100 * seed + i, momentum, 10.0 if fast and i == 0 else 1.0) for i in range(size)]
    start = torch.randn(DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    points = {n: start.clone() for n in names}
    guards = {n: SyncGuard(config) for n in names}
    for i, name in enumerate(names):
        for j, other in enumerate(names):
            if other != name and (standing == "vouched" or (standing == "lineage" and i > 0 and j in (0, i - 1))):
                guards[name].vouch(UID, other)
    trained = start.clone()  # where the mean of everyone's training leads
    spreads = []
    for _ in range(rounds):
        steps = [t.step() for t in trainers]
        points = {n: p + s for (n, p), s in zip(points.items(), steps)}
        trained = trained + sum(steps) / size
        results = {}
        for name in names:
            claims = [Contributed(o, 1, vec(points[o])) for o in names if o != name]
            results[name] = flat(guards[name].decide(UID, vec(points[name]), 1, claims).parameters)
        points = results
        spreads.append(spread(points))
    return spreads, float((points[names[0]] - trained).norm()) / DRIFT


def newcomer(established: int, momentum: float, seed: int, rounds: int, config: ReplicasConfig) -> tuple[int, int, float]:
    """``established`` honest replicas (vouched for each other) and a newcomer that caught up
    from the first: the rounds it merged its source, the rounds every other replica merged it,
    and how far it ends from its source, in drifts."""
    names = [f"h{i}" for i in range(established)] + ["new"]
    trainers = [Trainer(100 * seed + i, momentum) for i in range(len(names))]
    guards = {n: SyncGuard(config) for n in names}
    for name in names[:-1]:
        for other in names[:-1]:
            if other != name:
                guards[name].vouch(UID, other)
    guards["new"].vouch(UID, names[0])
    start = torch.randn(DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    points = {n: start.clone() for n in names}
    followed = merged = 0
    for _ in range(rounds):
        points = {n: p + t.step() for (n, p), t in zip(points.items(), trainers)}
        results = {}
        everyone = True
        for name in names:
            claims = [Contributed(o, 1, vec(points[o])) for o in names if o != name]
            verdict = guards[name].decide(UID, vec(points[name]), 1, claims)
            results[name] = flat(verdict.parameters)
            if name == "new":
                followed += names[0] in verdict.accepted
            else:
                everyone = everyone and "new" in verdict.accepted
        points = results
        merged += everyone
    return followed, merged, float((points["new"] - points[names[0]]).norm()) / DRIFT


MODES = {"independent": 0.0, "momentum 0.7": MOMENTUM}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", default="", help="attacks whose name contains this")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a guard setting of ReplicasConfig")
    args = parser.parse_args()
    config = ReplicasConfig(**{k: float(v) for k, v in (item.split("=", 1) for item in args.set)})
    seeds = range(args.seeds)
    columns = [(mode, honest) for mode in MODES for honest in (1, 2)]
    header = " | ".join(f"{mode[:11]:>11} {h} of {h + 2}" for mode, h in columns)
    for lineage in (False, True):
        who = ("two colluders the honest replicas loaded their state from (a lying lineage: only the pull budgets hold it)"
               if lineage else "two fresh colluders")
        print(f"{who}, {args.rounds} rounds, median of {args.seeds} seeds: how far the honest replicas moved "
              "in the attack's plane, in honest drifts [the bound at the end, in drifts]")
        print(f"{'attack':38} | {header}")
        for name, attack in ATTACKS.items():
            if args.only not in name:
                continue
            cells = []
            for mode, honest in columns:
                runs = [attacked(attack, honest, MODES[mode], seed, args.rounds, config, lineage) for seed in seeds]
                moved = statistics.median(r[0] for r in runs)
                bound = statistics.median(r[1] for r in runs)
                cells.append(f"{moved:9.1f} [{bound:4.1f}]")
            print(f"{name:38} | " + " | ".join(f"{c:>18}" for c in cells), flush=True)
    if args.only:
        return
    print()
    print("honest control: the largest pairwise distance after a round, in drifts (worst seed; vouched and "
          "lineage: worst round, fresh: the last round); the root's distance from the group's mean training at the end")
    for mode, momentum in MODES.items():
        cells = []
        for size in (2, 3, 4):
            runs = {kind: [honest_group(size, momentum, s, args.rounds, config, kind) for s in seeds]
                    for kind in ("vouched", "lineage", "fresh")}
            vouched = max(max(r[0]) for r in runs["vouched"])
            lineage = max(max(r[0]) for r in runs["lineage"])
            fresh = max(r[0][-1] for r in runs["fresh"])
            root = statistics.median(r[1] for r in runs["lineage"])
            merged = statistics.median(r[1] for r in runs["vouched"])
            cells.append(f"{size}: {vouched:.2f} vouched, {lineage:.2f} lineage, {fresh:.2f} fresh, "
                         f"root {root:.1f} (vouched {merged:.1f})")
        fast = max(max(honest_group(3, momentum, s, args.rounds, config, "vouched", fast=True)[0]) for s in seeds)
        print(f"  {mode:13} " + "; ".join(cells) + f"; 3 vouched, one training 10x: {fast:.2f}")
    print("newcomer that caught up from the first of the established replicas: rounds it merged its source, "
          "rounds all others merged it, its distance from its source at the end (drifts)")
    for mode, momentum in MODES.items():
        cells = []
        for established in (2, 3):
            for seed in seeds:
                followed, merged, apart = newcomer(established, momentum, seed, args.rounds, config)
                cells.append(f"{established}+1 seed {seed}: {followed}/{args.rounds}, {merged}, {apart:.1f}")
        print(f"  {mode:13} " + "; ".join(cells))


if __name__ == "__main__":
    main()
