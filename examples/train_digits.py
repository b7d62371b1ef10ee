"""Train a small mixture of remote experts on scikit-learn's digits through a local swarm.

    python examples/train_digits.py                      # starts a testnet: a relay + 4 volunteers (4x4 grid)
    python examples/train_digits.py --fail-rate 0.1      # a tenth of expert calls fail (Learning@home's test)
    python examples/train_digits.py --latency-ms 20      # every expert call waits 20 ms more
    python examples/train_digits.py --compression blockwise8_64   # 8-bit tensors on every link
    python examples/train_digits.py --swarm demo         # use a running swarm instead
    python examples/train_digits.py --churn              # volunteers join and leave all through training
    python examples/train_digits.py --churn --replicas 1 # the same without replicas, for comparison
    python examples/train_digits.py --liar times10       # 3 honest replicas of every expert and one that lies
    python examples/train_digits.py --liar negate --rotate  # a liar that rejoins under a fresh key when caught

--churn: the swarm file declares the grid ([[grid]], --replicas, --sync-period); volunteers run
`volunteer join SWARM` with no --experts (automatic placement), each living a random
--churn-life seconds (15:40), half leaving gracefully (hand-off) and half killed, never fewer
than 2 alive, at least --churn-processes (6) over the run. It prints how many experts lost their
state (must be 0 with replicas 2) and how many updates were lost.

--liar zeros|times10|negate|nan|random|subtle|scaled|turned|gradients: the swarm file declares the grid with --honest (3) + --liars (1) replicas
synced every --sync-period seconds; --honest volunteers and one liar (examples/lying_volunteer.py,
a `volunteer join` whose ffn experts lie) each host the whole grid. The trainer's guard and audits
should exclude the liar; it prints when (after how many of the liar's replies) and why, and
whether any honest volunteer was excluded. --honest N alone runs the same swarm without a liar.
--rotate: a liar the trainer excluded leaves and joins again at once under a fresh key (a new
identity with a clean record), as often as it is caught; the summary gives the share of all replies
its identities served (`liar_share`) and how many it used.
--audits alternate switches audits on and off every 10 steps (an audit runs in the background, so
its cost lands on the steps after it: blocks keep it in its own) and prints the median step time
of each.

The model: Linear(64→H) → ReLU → RemoteMixtureOfExperts(H, grid 4x4, k_best 4) → Linear(H→10).
Every forward and backward of the mixture goes to volunteer processes over libp2p (Noise,
yamux); the volunteers' experts learn too (backward applies their optimizer step). Prints test
accuracy per epoch and exits 0 once it reaches --target (default 0.95), 1 if it never does.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from volunteer import RemoteMixtureOfExperts, Swarm, TrustPolicy  # noqa: E402
from volunteer.experts.tensors import COMPRESSIONS  # noqa: E402
from volunteer.net.identity import KeyPair  # noqa: E402

ALTERNATE_EVERY = 10  # --audits alternate: steps with audits on, then as many with them off
COLUMNS = 80  # the widest line printed when the terminal does not say (a pipe, the README's demo)
FRESH_SURVEY_WAIT = 40.0  # --show-status: seconds to wait for a coverage survey made after the testnet was up


def columns() -> int:
    """The terminal's width, at most COLUMNS when it is not a terminal."""
    return shutil.get_terminal_size((COLUMNS, 24)).columns


def say(text: str, indent: str = "") -> None:
    """Print ``text`` wrapped to the terminal (80 columns in a pipe): long words such as
    multiaddrs stay whole, the lines after the first are indented two more."""
    print(textwrap.fill(text, columns(), initial_indent=indent, subsequent_indent=indent + "  ",
                        break_long_words=False, break_on_hyphens=False), flush=True)


def load_digits_split(seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return x_train, x_test, y_train, y_test


class Model(nn.Module):
    def __init__(self, swarm, hidden: int, grid: tuple[int, int], k_best: int, k_min: int, timeout: float,
                 compression: str = "auto") -> None:
        super().__init__()
        self.inp = nn.Linear(64, hidden)
        # the swarm file's [[grid]] when it declares one (--churn): what the volunteers place themselves on
        declared = swarm.spec.grids[0] if getattr(swarm.spec, "grids", None) else None
        self.moe = RemoteMixtureOfExperts(
            swarm, in_features=hidden, grid=declared, grid_size=grid, uid_prefix="expert", k_best=k_best, k_min=k_min,
            forward_timeout=timeout, backward_timeout=timeout, timeout_after_k_min=timeout / 4, compression=compression,
        )
        self.out = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.out(h + self.moe(h))


class Testnet:
    """`volunteer testnet` in a child process; stopping it stops every volunteer it started."""

    def __init__(self, n: int, grid: tuple[int, int], hidden: int, trainers: list[str] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="digits-testnet-"))
        self.proc: subprocess.Popen | None = None
        try:
            self._start(n, grid, hidden, trainers)
        except BaseException:  # Ctrl-C or a failed start: no process and no private key is left behind
            self.stop()
            raise

    def _start(self, n: int, grid: tuple[int, int], hidden: int, trainers: list[str]) -> None:
        experts = f"ffn:expert.[0:{grid[0]}].[0:{grid[1]}]"
        env = dict(os.environ, VOLUNTEER_CONFIG_DIR=str(self.dir / "config"), PYTHONUNBUFFERED="1")
        listed = [arg for peer in trainers for arg in ("--trainer", peer)]  # the swarm file's trainers
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "volunteer", "testnet", "-n", str(n), "--experts", experts, "--hidden-dim", str(hidden),
             "--dir", str(self.dir / "net"), "--name", "digits", "--no-dashboard", *listed],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.swarm_file = self.dir / "net" / "swarm.toml"
        self.controls = [self.dir / "net" / f"v{i}.sock" for i in range(n)]
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            say(line.strip(), "  " * (1 + (len(line) - len(line.lstrip())) // 2))
            if "volunteers ready" in line:
                self.ready_at = time.monotonic()
                return
        raise SystemExit("testnet did not start:\n" + "".join(lines))

    def kill_one(self) -> int:
        """SIGKILL the first volunteer (a crash: no graceful leave, no tombstones)."""
        import trio

        from volunteer.cli.control import request

        pid = trio.run(request, self.controls[0], "status")["status"]["pid"]
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # the testnet's keys, logs and checkpoints were for this run only: no private key is left behind
        shutil.rmtree(self.dir, ignore_errors=True)


class ReplicatedSwarm:
    """``honest`` volunteer processes each hosting every expert of the grid (replicas synced every
    ``sync_period`` s) and, with ``lie``, ``liars`` more whose experts lie (examples/lying_volunteer.py)."""

    def __init__(self, grid: tuple[int, int], hidden: int, honest: int, lie: str | None, sync_period: float, seed: int,
                 liars: int = 1, receipts: bool = True, rotate: bool = False) -> None:
        from churn_swarm import ChurnSwarm

        experts = grid[0] * grid[1]
        self.lie = lie
        self.liars = liars if lie else 0
        self.swarm = ChurnSwarm(grid=grid, hidden=hidden, replicas=honest + self.liars, sync_period=sync_period,
                                max_experts=experts, life=(1e9, 1e9), seed=seed, receipts=receipts)
        self.honest = honest
        self.honest_peers: list[str] = []
        self.liar_peer: str | None = None
        self.liar_peers: list[str] = []  # every identity a liar used, first first
        self.rotate = rotate
        self._serving: dict[str, subprocess.Popen] = {}  # the liars' identities still up -> their process
        self._rejoining: threading.Thread | None = None

    def start(self):
        """Start the volunteers (the liar last: it catches up from an honest replica, as a real
        newcomer would); returns the swarm file."""
        for _ in range(self.honest):
            self.honest_peers.append(self.swarm.peer_id(self.swarm.start_volunteer()))
        for _ in range(self.liars):
            self._start_liar()
        self.liar_peer = self.liar_peers[0] if self.liar_peers else None
        return self.swarm.swarm_file

    def _start_liar(self) -> None:
        peer = self.swarm.peer_id(self.swarm.start_volunteer(lie=self.lie))  # a fresh key each time
        self._serving[peer] = self.swarm.alive[-1][0]
        self.liar_peers.append(peer)
        print(f"liar: {peer} ({self.lie})", flush=True)

    def rotate_caught(self, trust: dict) -> None:
        """--rotate: each liar identity ``trust`` (the trainer's report) shows excluded leaves and
        its liar joins again under a fresh key, as an attacker that notices it is no longer called
        would (this one is told at once: the worst case). The new one joins in the background, so
        training goes on meanwhile."""
        if not self.rotate or (self._rejoining is not None and self._rejoining.is_alive()):
            return
        caught = [peer for peer in self._serving if trust.get(peer, {}).get("standing") == "excluded"]
        if not caught:
            return

        def rejoin() -> None:
            for peer in caught:
                process = self._serving.pop(peer)
                process.kill()
                print(f"liar {peer} was excluded: it joins again under a fresh key", flush=True)
                try:
                    self._start_liar()
                except RuntimeError as exc:
                    print(f"liar failed to join again: {exc}", flush=True)

        self._rejoining = threading.Thread(target=rejoin, daemon=True)
        self._rejoining.start()

    def report(self, trust: dict, best: float, step_times: dict[bool, list[tuple[float, float]]], mixture: dict) -> None:
        """What the trainer's checks did to the liar and to the honest volunteers, and a summary
        line for benchmarks/audits.py."""
        import json
        import statistics

        if self._rejoining is not None:
            self._rejoining.join()  # every identity it used is listed before the count
        honest_excluded = [p for p in self.honest_peers if trust.get(p, {}).get("standing") == "excluded"]
        for peer in honest_excluded:
            print(f"HONEST volunteer {peer} excluded: {trust[peer]['excluded_because']}", flush=True)
        for peer in self.liar_peers:
            record = trust.get(peer, {})
            if record.get("standing") == "excluded":
                print(f"liar excluded after {record['excluded_after_replies']} of its replies: {record['excluded_because']}",
                      flush=True)
            else:
                print(f"liar NOT excluded ({record.get('standing', 'never called')}, {record.get('replies', 0)} replies, "
                      f"{record.get('audits_disagreed', 0)} audits disagreed)", flush=True)
        liars = [trust.get(peer, {}) for peer in self.liar_peers]
        # the liar that lasted longest speaks for them all
        liar = max(liars, key=lambda r: (r.get("standing") != "excluded", r.get("excluded_after_replies") or 0),
                   default={})
        medians = {on: statistics.median(wall for wall, _ in t) if t else None for on, t in step_times.items()}
        cpu = {on: statistics.median(cpu for _, cpu in t) if t else None for on, t in step_times.items()}
        summary = {
            "lie": self.lie, "best": best, "liar_excluded": liar.get("standing") == "excluded",
            "liar_excluded_after": liar.get("excluded_after_replies"), "liar_replies": liar.get("replies", 0),
            "liar_audits_disagreed": liar.get("audits_disagreed", 0),
            "liars": len(self.liar_peers), "liars_excluded": sum(r.get("standing") == "excluded" for r in liars),
            "liars_replies": sum(r.get("replies", 0) for r in liars),
            # --rotate: the identities the liars used, and the share of every checked reply theirs served
            "liar_identities": len(self.liar_peers),
            "liar_share": round(sum(r.get("replies", 0) for r in liars)
                                / max(1, sum(r.get("replies", 0) for r in trust.values())), 4),
            "honest_excluded": len(honest_excluded),
            # an honest replica of one expert whose syncs lagged, outvoted on it: not called for it
            "honest_outvoted_on": sum(len(trust.get(p, {}).get("outvoted_on", [])) for p in self.honest_peers),
            "honest_replies": sum(trust.get(p, {}).get("replies", 0) for p in self.honest_peers),
            "step_median_audits_on": medians[True], "step_median_audits_off": medians[False],
            "step_cpu_median_audits_on": cpu[True], "step_cpu_median_audits_off": cpu[False],
            "calls": mixture["calls"], "audits": mixture["audits"],
        }
        print("summary: " + json.dumps(summary), flush=True)

    def close(self) -> None:
        self.swarm.close()


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 128) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i : i + batch]).argmax(-1) == y[i : i + batch]).sum().item()
    model.train()
    return correct / len(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--swarm", help="join this swarm (name, file or multiaddr) instead of starting a testnet")
    parser.add_argument("--volunteers", type=int, default=4)
    parser.add_argument("--grid", default="4x4")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--k-best", type=int, default=4)
    parser.add_argument("--k-min", type=int, default=1)
    parser.add_argument("--epochs", type=int, help="at most this many epochs (default 30; --churn: 2000, as it "
                        "trains on until --churn-processes volunteers have joined)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--timeout", type=float, default=5.0, help="forward/backward timeout per expert call (s)")
    parser.add_argument("--fail-rate", type=float, default=0.0, help="fraction of expert calls made to fail")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="extra delay added to every expert call")
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--compression", default="auto", choices=["auto", *COMPRESSIONS],
                        help="tensors on the wire: auto (what each link calls for: float16, 8-bit where slow) or fixed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show-status", action="store_true", help="print a volunteer's dashboard at the end")
    parser.add_argument("--kill-volunteer-at-epoch", type=int, metavar="E",
                        help="SIGKILL one volunteer of the testnet when epoch E starts (training must go on)")
    parser.add_argument("--churn", action="store_true", help="volunteers join and leave all through training")
    parser.add_argument("--replicas", type=int, default=2, help="--churn: the grid's replicas")
    parser.add_argument("--sync-period", type=float, default=5.0, help="--churn: seconds between replica syncs")
    parser.add_argument("--churn-life", default="15:40", help="--churn: each volunteer lives MIN:MAX seconds")
    parser.add_argument("--churn-processes", type=int, default=6, help="--churn: volunteer processes over the run, at least")
    parser.add_argument("--max-experts", type=int, help="--churn: experts per volunteer (default: the whole grid)")
    parser.add_argument("--liar", choices=("zeros", "times10", "negate", "nan", "random", "subtle", "scaled", "turned",
                                           "gradients"),
                        help="one volunteer (--liars of them) among honest replicas of every expert lies this way")
    parser.add_argument("--liars", type=int, default=1, help="--liar: volunteers that lie, each a replica of every expert")
    parser.add_argument("--rotate", action="store_true",
                        help="--liar: a liar the trainer excluded joins again at once under a fresh key")
    parser.add_argument("--honest", type=int, help="honest replicas of every expert (default 3 with --liar)")
    parser.add_argument("--audits", choices=("on", "off", "alternate"), default="on",
                        help="audit calls (alternate: on and off every 10 steps, to compare step times)")
    parser.add_argument("--audit-rate", type=float, help="audit every host's calls at this rate, trusted or not "
                        "(default: the adaptive policy: every reply of a new host until it has passed 3 audits, 20 %% until "
                        "it has passed 10 in a row, then 1/streak, at least 2 %%)")
    parser.add_argument("--receipts", action=argparse.BooleanOptionalAction, default=True,
                        help="--honest/--liar: the swarm asks for exact audits (receipts on every reply, disputes "
                             "settled by recompute; the default); --no-receipts: replicas' replies are compared")
    parser.add_argument("--listed-trainer", action="store_true",
                        help="the testnet's swarm file lists this trainer's key as its only trainer")
    parser.add_argument("--trainer-cert", metavar="FILE",
                        help="present this trainer certificate (volunteer trainer-cert) to the swarm's volunteers")
    args = parser.parse_args(argv)
    # SIGTERM ends the run as Ctrl-C does: through the finally blocks that stop the testnet and remove its keys
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    grid = tuple(int(g) for g in args.grid.lower().split("x"))
    epochs = args.epochs or (2000 if args.churn else 30)
    torch.manual_seed(args.seed)
    x_train, x_test, y_train, y_test = load_digits_split(args.seed)

    churn = ledger = replicated = None
    if args.liar or args.honest:
        # what the audits saw (each disagreement and how a third replica settled it), not only
        # whom they excluded
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        logging.getLogger("volunteer.experts.audit").setLevel(logging.INFO)
        replicated = ReplicatedSwarm(grid, args.hidden, args.honest or 3, args.liar, args.sync_period, args.seed,
                                     liars=args.liars, receipts=args.receipts, rotate=args.rotate)
    elif args.churn:
        from churn_swarm import ChurnSwarm, ExpertLedger

        life = tuple(float(v) for v in args.churn_life.split(":"))
        churn = ChurnSwarm(grid=grid, hidden=args.hidden, replicas=args.replicas, sync_period=args.sync_period,
                           max_experts=args.max_experts or grid[0] * grid[1], life=life, seed=args.seed)
        ledger = ExpertLedger()
    # --listed-trainer: the testnet's swarm file lists this trainer's key, so only it may train
    keypair = KeyPair.generate() if args.listed_trainer else None
    listed = [str(keypair.peer_id)] if keypair is not None else []
    testnet = None if args.swarm or churn or replicated else Testnet(args.volunteers, grid, args.hidden, listed)
    # audits on / off -> (wall, this process's CPU) seconds per step; the CPU time of all our
    # threads (the trio one runs the audits) is what other processes' load disturbs least
    step_times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    try:
        if churn is not None:
            churn.begin()
        from volunteer.experts.faults import FaultInjection

        swarm_file = replicated.start() if replicated else churn.swarm_file if churn else testnet.swarm_file
        # --audit-rate: that rate for everyone (nobody earns the 1/streak rate: it would be higher;
        # and no new host has its first replies all audited)
        flat = TrustPolicy(audit_rate=args.audit_rate or 0.0, untrusted_rate=args.audit_rate or 0.0, trust_after=1 << 30,
                           prove_after=0)
        trust = {"trust": flat} if args.audit_rate else {}

        faults = FaultInjection(fail_rate=args.fail_rate, latency=args.latency_ms / 1000, seed=args.seed)
        swarm = Swarm.join(args.swarm or swarm_file, faults=faults, keypair=keypair, trainer_cert=args.trainer_cert,
                           **trust)
        if keypair is not None:
            print(f"training as listed trainer {keypair.peer_id.short()} (the swarm file lists only it)", flush=True)
        with swarm:
            model = Model(swarm, args.hidden, grid, args.k_best, args.k_min, args.timeout, args.compression)
            model.moe.audits = args.audits != "off"
            optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
            started = time.monotonic()
            best = 0.0
            generator = torch.Generator().manual_seed(args.seed)
            steps = 0
            for epoch in range(1, epochs + 1):
                if testnet is not None and epoch == args.kill_volunteer_at_epoch:
                    pid = testnet.kill_one()
                    print(f"killed volunteer process {pid} (SIGKILL): its experts vanish mid-training", flush=True)
                order = torch.randperm(len(x_train), generator=generator)
                losses = []
                for i in range(0, len(order), args.batch_size):
                    idx = order[i : i + args.batch_size]
                    if args.audits == "alternate" and steps % ALTERNATE_EVERY == 0:
                        model.moe.audits = not model.moe.audits
                    steps += 1
                    step_started, cpu_started = time.perf_counter(), time.process_time()
                    loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    step_times[model.moe.audits].append((time.perf_counter() - step_started, time.process_time() - cpu_started))
                    losses.append(loss.item())
                    if replicated is not None and replicated.rotate:
                        replicated.rotate_caught(swarm.trust_report())
                    if ledger is not None and (i // args.batch_size) % 5 == 0:
                        ledger.watch(swarm, [f"expert.{a}.{b}" for a in range(grid[0]) for b in range(grid[1])])
                acc = accuracy(model, x_test, y_test)
                best = max(best, acc)
                stats = faults.summary()
                print(f"epoch {epoch:>2}  loss {sum(losses) / len(losses):.3f}  test accuracy {acc:.3f}  "
                      f"({time.monotonic() - started:.0f} s{stats})", flush=True)
                if acc >= args.target and (churn is None or churn.started >= args.churn_processes):
                    break
            mixture = model.moe.stats
            say(f"mixture: {mixture['calls']} expert calls, {mixture['failures']} failed ({mixture['failed_over']} "
                f"retried on another replica), {mixture['rerouted']} samples re-routed to a second round, "
                f"{mixture['samples_short']} short of k_min (zero output)")
            say(f"checks: {mixture['rejected']} replies rejected by the guard, {mixture['audits']} audits, "
                f"{mixture['disagreements']} disagreements, {mixture['outvoted']} replicas outvoted on an expert, "
                f"{mixture['stale']} stale, {mixture['exclusions']} volunteers excluded")
            if replicated is not None:
                replicated.report(swarm.trust_report(), best, step_times, mixture)
            if churn is not None:
                print(f"churn: {churn.started} volunteer processes ({churn.graceful} left gracefully, {churn.killed} "
                      f"killed), replicas {args.replicas}: experts lost {ledger.experts_lost}, "
                      f"updates lost {ledger.updates_lost}", flush=True)
                print(f"ledger: {ledger.stale_answers} stale DHT answers (an older heartbeat of a host) ignored", flush=True)
            if args.show_status and testnet is not None:
                _show_status(testnet)
    finally:
        if testnet is not None:
            testnet.stop()
        if churn is not None:
            churn.close()
        if replicated is not None:
            replicated.close()
    reached = best >= args.target
    print(f"{'reached' if reached else 'did NOT reach'} {args.target:.0%} test accuracy (best {best:.3f})")
    return 0 if reached else 1


def _show_status(testnet: Testnet) -> None:
    """A volunteer's dashboard, at the terminal's width, once its view of the grid's coverage
    comes from a survey made after every volunteer was up (one from the start said most experts
    had no host right after training had called all of them)."""
    import trio

    from volunteer.cli.control import request
    from volunteer.cli.dashboard import render_text

    deadline = time.monotonic() + FRESH_SURVEY_WAIT
    while True:
        snapshot = trio.run(request, testnet.controls[0], "status")["status"]
        age = (snapshot.get("coverage") or {}).get("surveyed_age_s")
        if age is None or age <= time.monotonic() - testnet.ready_at or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    screen = render_text(snapshot, width=columns(), height=60)
    print("\n".join(line.rstrip() for line in screen.splitlines()))


if __name__ == "__main__":
    sys.exit(main())
