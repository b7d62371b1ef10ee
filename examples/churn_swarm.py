"""A local swarm whose volunteers come and go (``train_digits.py --churn``, ``benchmarks/churn.py``).

An anchor process routes the DHT only (``--max-experts 0``); volunteer processes join with
``volunteer join SWARM`` and no ``--experts`` (automatic placement on the swarm file's grid), each
living a random ``life`` seconds; when one's time is up a replacement is started and has joined
before the old one goes, alternately gracefully (SIGTERM: hand-off, then checkpoints) and killed
(SIGKILL), so never fewer than ``min_alive`` volunteers are up. ``ExpertLedger`` watches the
declared versions from the trainer's side and counts experts lost (an expert that had trained
state shows up again at version 0) and updates lost (drops of the freshest declared version).
Every child process is killed when the swarm is closed, whatever happened. Without ``begin``
nobody comes or goes: a plain replicated swarm (``train_digits.py --liar`` starts one, one of its
volunteers lying).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 60.0  # a volunteer that has not joined by then is treated as failed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ChurnSwarm:
    """The anchor, the churning volunteers, and the swarm file that describes them."""

    def __init__(self, *, grid: tuple[int, ...], hidden: int, replicas: int, max_experts: int, sync_period: float,
                 life: tuple[float, float] = (15.0, 40.0), min_alive: int = 2, seed: int = 0, verbose: bool = True,
                 receipts: bool = True) -> None:
        from volunteer.net.identity import load_or_create_keypair

        self.dir = Path(tempfile.mkdtemp(prefix="churn-swarm-"))
        self.life, self.min_alive, self.max_experts = life, min_alive, max_experts
        self.random = random.Random(seed)
        self.verbose = verbose
        self.log_flags = os.environ.get("CHURN_VOLUNTEER_FLAGS", "-v").split()  # e.g. "-vv" for a post-mortem
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", VOLUNTEER_CONFIG_DIR=str(self.dir / "config"),
                        VOLUNTEER_STATE_DIR=str(self.dir / "state"), VOLUNTEER_RUNTIME_DIR=str(self.dir / "run"),
                        VOLUNTEER_NO_MDNS="1", VOLUNTEER_EXIT_WITH_PARENT=str(os.getpid()))
        keypair, _ = load_or_create_keypair(self.dir / "anchor.key")
        port = free_port()
        self.swarm_file = self.dir / "swarm.toml"
        size = ", ".join(map(str, grid))
        grid_table = (f'[[grid]]\nprefix = "expert"\nsize = [{size}]\nexpert = "ffn"\nhidden_dim = {hidden}\n'
                      f"replicas = {replicas}\nsync_period = {sync_period}\n")
        wanted = "" if receipts else "receipts = false\n"  # exact audits (receipts on every reply) unless opted out
        self.swarm_file.write_text(
            f'name = "churn"\nbootstrap = ["/ip4/127.0.0.1/tcp/{port}/p2p/{keypair.peer_id}"]\n' + wanted + grid_table
        )
        anchor_file = self.dir / "anchor.toml"  # the first node of the swarm bootstraps from nobody
        if verbose:
            print(f"  churn: swarm directory {self.dir} (volunteer logs: vN.log)", flush=True)
        anchor_file.write_text('name = "churn"\n' + wanted + grid_table)
        self.started = 0  # volunteers that joined
        self._named = 0
        self.graceful = 0
        self.killed = 0
        self.alive: list[tuple[subprocess.Popen, float]] = []  # (process, when its life ends)
        self._all: list[subprocess.Popen] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.anchor = self._spawn("anchor", ["--max-experts", "0", "--identity", str(self.dir / "anchor.key"),
                                             "--listen", f"/ip4/127.0.0.1/tcp/{port}"], anchor_file)

    def _spawn(self, name: str, extra: list[str], swarm_file: Path | None = None, lie: str | None = None) -> subprocess.Popen:
        # a liar runs the same `volunteer join`, its ffn experts made to lie (examples/lying_volunteer.py)
        program = [str(ROOT / "examples" / "lying_volunteer.py"), lie] if lie else ["-m", "volunteer"]
        cmd = [sys.executable, *program, "join", str(swarm_file or self.swarm_file), "--yes", "--device", "cpu", "--no-dashboard",
               "--no-mdns", "--control", str(self.dir / f"{name}.sock"), *extra]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
                                cwd=str(ROOT))
        self._all.append(proc)
        deadline = time.monotonic() + READY_TIMEOUT
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:  # "joined swarm" is printed once experts are caught up and served
            lines.append(line)
            if "control socket" in line:
                break
            if time.monotonic() > deadline:
                break
        else:
            raise RuntimeError(f"{name} exited before joining:\n" + "".join(lines[-20:]))
        (self.dir / f"{name}.log").write_text("".join(lines))
        for line in lines:
            self._echo(name, line)
        threading.Thread(target=self._drain, args=(proc, name), daemon=True).start()
        return proc

    def _drain(self, proc: subprocess.Popen, name: str) -> None:
        assert proc.stdout is not None
        with open(self.dir / f"{name}.log", "a") as log:  # every line kept, for a post-mortem
            for line in proc.stdout:
                log.write(line)
                self._echo(name, line)

    def _echo(self, name: str, line: str) -> None:
        """Show what replicas did (catch-ups and hand-offs) among the trainer's lines."""
        if self.verbose and any(what in line for what in ("caught up", "handed off", "could not hand off")):
            print(f"  [{name}] {line.rstrip()}", flush=True)

    def start_volunteer(self, lie: str | None = None) -> str:
        """One more volunteer, placed by the swarm (returns its name once it has joined);
        ``lie``: its experts lie that way (``examples/lying_volunteer.py``)."""
        self._named += 1
        name = f"v{self._named}"
        proc = self._spawn(name, ["--max-experts", str(self.max_experts), "--identity", str(self.dir / f"{name}.key"),
                                  "--checkpoints", str(self.dir / "checkpoints" / name), "--recheck-period", "5", *self.log_flags,
                                  "--listen", "/ip4/127.0.0.1/tcp/0"], lie=lie)
        self.started += 1
        self.alive.append((proc, time.monotonic() + self.random.uniform(*self.life)))
        if self.verbose:
            print(f"  churn: volunteer {name} joined ({len(self.alive)} alive)", flush=True)
        return name

    def peer_id(self, name: str) -> str:
        """The PeerID of a volunteer this swarm started."""
        from volunteer.net.identity import load_or_create_keypair

        keypair, _ = load_or_create_keypair(self.dir / f"{name}.key")
        return str(keypair.peer_id)

    def _end(self, proc: subprocess.Popen) -> None:
        graceful = self.graceful <= self.killed  # alternate: half leave gracefully, half are killed
        if graceful:
            self.graceful += 1
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=45)
            except subprocess.TimeoutExpired:
                proc.kill()
        else:
            self.killed += 1
            proc.kill()
            proc.wait()
        if self.verbose:
            print(f"  churn: a volunteer {'left gracefully' if graceful else 'was killed'} "
                  f"({len(self.alive)} alive)", flush=True)

    def begin(self, initial: int = 3) -> None:
        """Start ``initial`` volunteers, then churn in the background until ``close``."""
        for _ in range(max(initial, self.min_alive)):
            self.start_volunteer()
        self._thread = threading.Thread(target=self._churn, daemon=True)
        self._thread.start()

    def _churn(self) -> None:
        while not self._stop.wait(0.5):
            now = time.monotonic()
            due = [entry for entry in self.alive if entry[1] <= now]
            if not due:
                continue
            try:
                self.start_volunteer()  # the replacement has joined before the old one goes
            except RuntimeError as exc:
                print(f"  churn: a replacement failed to start: {exc}", flush=True)
                continue
            proc, _ = due[0]
            self.alive.remove(due[0])
            if len(self.alive) >= self.min_alive:
                self._end(proc)
            else:
                self.alive.append((proc, now + self.life[0]))

    def close(self) -> None:
        """Stop churning and kill every process this swarm started."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        for proc in self._all:
            if proc.poll() is None:
                proc.kill()
        for proc in self._all:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> "ChurnSwarm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ExpertLedger:
    """The freshest declared version of each expert, as a trainer sees it, and what was lost.

    A host counts with its newest declaration (by heartbeat) until that declaration expires: one
    lookup may be answered by DHT replicas that missed a host's latest heartbeat (a stale copy) or
    lack its record for now (a partial answer), and neither is a loss. A host that leaves takes
    its declared version with it once its record is gone (tombstoned or expired)."""

    def __init__(self, verbose: bool = True) -> None:
        self.best: dict[str, int] = {}
        # uid → host → (heartbeat, version, expiration) of its newest declaration seen
        self.latest: dict[str, dict[str, tuple[float, int, float]]] = {}
        self.experts_lost = 0
        self.updates_lost = 0
        self.stale_answers = 0  # declarations older than one already seen from the same host
        self.verbose = verbose

    def observe(self, found: dict, now: float) -> None:
        """Feed ``get_experts``' answer (uid → declarations with ``version``, ``heartbeat`` and
        ``expiration``) at DHT time ``now``."""
        for uid, decls in found.items():
            latest = self.latest.setdefault(uid, {})
            answered = set()
            for decl in decls:
                peer = str(decl.peer)
                answered.add(peer)
                seen = latest.get(peer)
                if seen is not None and decl.heartbeat < seen[0]:
                    self.stale_answers += 1
                    continue
                latest[peer] = (decl.heartbeat, decl.version, decl.expiration)
            current = {
                peer: version for peer, (_, version, expiration) in latest.items() if peer in answered or expiration > now
            }
            if not current:
                continue
            fresh = max(current.values())
            before = self.best.get(uid, 0)
            if fresh < before:
                self.updates_lost += before - fresh
                if fresh == 0:
                    self.experts_lost += 1
                if self.verbose:
                    hosts = ", ".join(f"{peer[-6:]}@{version}" for peer, version in sorted(current.items()))
                    print(f"  ledger: {uid} fell from version {before} to {fresh} (hosts {hosts})", flush=True)
            self.best[uid] = fresh

    def watch(self, swarm, uids: list[str]) -> None:
        """One look at the DHT through the trainer's swarm."""
        from volunteer.dht.grid import get_experts

        try:
            self.observe(swarm.loop.run(get_experts, swarm.dht, uids), swarm.dht.clock())
        except Exception as exc:  # a missed look is not a loss; the next one counts
            print(f"  ledger: lookup failed: {exc}", flush=True)


__all__ = ["ChurnSwarm", "ExpertLedger"]
