"""The trainer's handle on a swarm: ``Swarm.join("demo")``.

    swarm = Swarm.join("demo")                      # a name, a swarm file, or a bootstrap multiaddr
    moe = RemoteMixtureOfExperts(swarm, in_features=64, grid_size=(4, 4), uid_prefix="expert", k_best=4)
    ...train as usual...
    swarm.trust_report()                            # what audits found, per volunteer
    swarm.verdict_report()                          # proofs published, checked, and what they exclude
    swarm.close()

A Swarm owns a background thread running trio with a Host joined to the swarm as its kind says
(``kind_of(spec).join_trainer``: ours, a client-mode DHT node; hivemind's, its DHT and kad), so a
plain synchronous PyTorch loop never sees trio. RemoteExpert and RemoteMixtureOfExperts call
through ``swarm.loop`` and the kind's ``swarm.directory``; ``find_best_experts``, ``get_experts``
and ``list_experts`` (our kind's DHT) are here for scripts.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Sequence

import trio

from typing import TYPE_CHECKING

from .dht import DHTConfig, DHTNode
from .errors import VolunteerError
from .experts.guard import ReplyGuard
from .experts.trust import DEFAULT_POLICY, TrustLedger, TrustPolicy
from .kinds import SwarmKind, TrainerParts, kind_of
from .net.host import Host
from .net.stack import open_stack
from .net.identity import KeyPair
from .swarmfile import SwarmSpec, resolve_swarm

if TYPE_CHECKING:
    from .experts.audit import ProofFound
    from .experts.directory import ExpertDirectory
    from .experts.faults import FaultInjection
    from .experts.verdicts import VerdictWatch

JOIN_TIMEOUT = 30.0
VOUCH_PERIOD = 60.0  # seconds between two rounds of vouches for the hosts this trainer called
VOUCH_TTL = 3600.0  # seconds a vouch record lives in the DHT (its max_ttl): republished at half of it
VOUCH_LAST_WORD = 5.0  # seconds a closing swarm gives its last vouches to be stored

log = logging.getLogger(__name__)


class Swarm:
    """A connection to a swarm for trainers and scripts; create it with ``Swarm.join``.

    ``faults``: fault injection for experiments (``experts.faults.FaultInjection``): every expert
    call through this swarm asks it first; set or cleared between experiments.
    ``trust``: the audit policy (``experts.trust.TrustPolicy``) of this trainer's trust ledger."""

    def __init__(self, spec: SwarmSpec, *, keypair: KeyPair | None = None, listen: Sequence[str] = (),
                 dht_config: DHTConfig | None = None, faults: "FaultInjection | None" = None,
                 trust: TrustPolicy = DEFAULT_POLICY, trainer_cert: str | os.PathLike | None = None) -> None:
        from .experts.callstats import CallStats
        from .experts.loop import BackgroundLoop
        from .dht.vouches import VouchBook

        # what this trainer has seen of each volunteer (standings, streaks, exclusions) and the
        # guard every mixture on this swarm checks replies with (experts/trust.py, guard.py)
        self.trust = TrustLedger(trust)
        self.guard = ReplyGuard(self.trust)
        self.spec = spec
        self.kind: SwarmKind = kind_of(spec)  # chosen once: how this swarm is joined and called
        self.swarm_id = spec.id
        self.keypair = keypair or KeyPair.generate()
        # a swarm whose organiser admits trainers by certificate: ours, presented on every call
        self.credential = _credential(trainer_cert, self.keypair) if trainer_cert is not None else None
        self.listen = list(listen)
        self.dht_config = dht_config or DHTConfig.for_trainer(spec.id)
        self.faults = faults
        self.loop = BackgroundLoop()
        self.calls = CallStats()  # every expert call made through this swarm (expert_stats)
        # the replies this trainer accepted, per host: signed and published as vouches (their credit)
        self.vouches = VouchBook(self.keypair, spec.id, time.time())
        self._host: Host | None = None
        self._joined: TrainerParts | None = None
        # our proofs published, and everyone's checked (ours kind only: its DHT holds them)
        self.verdicts: "VerdictWatch | None" = None
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._ready, self._closing, self._done = trio.Event(), trio.Event(), trio.Event()
        self._error: BaseException | None = None

    @classmethod
    def join(cls, swarm: str | os.PathLike[str] | SwarmSpec, *, timeout: float = JOIN_TIMEOUT, **options) -> "Swarm":
        """Connect to ``swarm`` (a name from ~/.config/volunteer/swarms, a swarm file, a bootstrap
        multiaddr, or a SwarmSpec) and return once the DHT has at least one peer."""
        spec = swarm if isinstance(swarm, SwarmSpec) else resolve_swarm(os.fspath(swarm))
        self = cls(spec, **options)
        self.loop.start()
        try:
            self.loop.run(self._start, timeout=timeout)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def host(self) -> Host:
        """The Host this swarm runs on (the trio loop's)."""
        if self._host is None:
            raise VolunteerError("this swarm is not joined (use Swarm.join)")
        return self._host

    @property
    def directory(self) -> "ExpertDirectory":
        """The swarm kind's expert directory: where mixtures find experts and how they call them."""
        return self._trainer().directory

    @property
    def dht(self):
        """The swarm's DHT node (ours: a ``DHTNode``; hivemind's: a ``HivemindDHT``)."""
        return self._trainer().dht

    def _trainer(self) -> TrainerParts:
        if self._joined is None:
            raise VolunteerError("this swarm is not joined (use Swarm.join)")
        return self._joined

    async def _start(self) -> None:
        self._started = True
        trio.lowlevel.spawn_system_task(self._main)
        await self._ready.wait()
        if self._error is not None:
            raise self._error

    async def _main(self) -> None:
        try:
            async with open_stack(self.keypair, self.listen) as host:
                self._host = host
                self._joined = await self.kind.join_trainer(host, self.spec, dht_config=self.dht_config,
                                                            credential=self.credential)
                if isinstance(self._joined.dht, DHTNode) and self.spec.receipts:  # only exact audits prove
                    self.verdicts = self._watch_verdicts(self._joined.dht)
                    await host.add_service(self.verdicts)
                self._ready.set()
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._publish_vouches)
                    await self._closing.wait()
                    nursery.cancel_scope.cancel()
                with trio.move_on_after(VOUCH_LAST_WORD):  # what the last calls earned, before leaving
                    await self._store_vouches(self.vouches.due(time.time()))
        except BaseException as exc:  # a system task must not crash the loop: hand it to the caller
            self._error = exc if isinstance(exc, Exception) else VolunteerError(repr(exc))
        finally:
            self._ready.set()
            self._done.set()

    def _watch_verdicts(self, dht: DHTNode) -> "VerdictWatch":
        """The watcher of shared verdicts: a proof another peer published and we checked by
        recompute excludes its host from this trainer's calls (the ledger's exclusion)."""
        from .experts.verdicts import VerdictWatch, snapshot_fetcher

        def excluded(peer: str, proven) -> None:
            self.trust.exclude(peer, proven.reason, proof=True)

        def peers() -> list[str]:  # the hosts we deal with, besides those the index names
            return [peer for peer, row in self.trust.report().items() if row["standing"] != "excluded"]

        return VerdictWatch(dht, self.keypair, self.spec.id, snapshot_fetcher(self.directory.call_expert),
                            peers=peers, on_proven=excluded)

    def publish_proof(self, proof: "ProofFound") -> None:
        """An exact audit of this trainer proved ``proof.peer`` a liar: publish the proof for
        every other peer to check (``TrainerSwarm.publish_proof``; on the trio thread)."""
        if self.verdicts is None or self._nursery is None:
            return
        self._nursery.start_soon(self.verdicts.publish, proof.peer, proof.uid, proof.evidence, proof.reason)

    async def _publish_vouches(self) -> None:
        """Every ``VOUCH_PERIOD`` seconds, sign and store a vouch for each host whose tally moved
        (and every one again before their records expire), where the swarm's health page reads."""
        last_all = time.time()
        while True:
            await trio.sleep(VOUCH_PERIOD)
            now = time.time()
            everyone = now - last_all >= VOUCH_TTL / 2
            last_all = now if everyone else last_all
            await self._store_vouches(self.vouches.due(now, everyone=everyone))

    async def _store_vouches(self, vouches: list) -> None:
        from .dht.vouches import vouch_item

        dht = self._joined.dht if self._joined is not None else None
        # vouches live in our kind's DHT (the relay's health page reads it); another kind's has no reader
        if not vouches or not isinstance(dht, DHTNode):
            return
        expiration = time.time() + VOUCH_TTL
        try:
            await dht.store_many([vouch_item(v, expiration) for v in vouches])
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            log.info("vouches not stored this time (%d hosts): %s", len(vouches), exc)

    # --- queries (synchronous) ----------------------------------------------------------------------
    def find_best_experts(self, prefix: str, grid_scores, beam_size: int, *, timeout: float = 30.0):
        """Beam search over a grid: the ``beam_size`` best live experts (``ExpertMatch`` list)."""
        from .dht.beam import find_best_experts

        scores = [[float(s) for s in dim] for dim in grid_scores]
        return self.loop.run(find_best_experts, self.dht, prefix, scores, beam_size, timeout=timeout)

    def get_experts(self, uids: Sequence[str], *, timeout: float = 30.0):
        """``{uid: [Declaration, ...]}``: live hosts of each uid, best first."""
        from .dht.grid import get_experts

        return self.loop.run(get_experts, self.dht, list(uids), timeout=timeout)

    def list_experts(self, prefix: str = "expert.", *, timeout: float = 30.0):
        """Every live expert under a grid prefix: ``{uid: [Declaration, ...]}``."""
        from .dht.grid import list_experts

        return self.loop.run(list_experts, self.dht, prefix, timeout=timeout)

    def expert_stats(self, prefix: str | None = None) -> dict[str, list[dict]]:
        """Where this trainer's expert calls spend their time: ``{uid: [one dict per host]}``
        with the host's peer, connection path (direct tcp, hole-punched quic, relayed via …), round trip
        (``rtt_ms``), payload bytes per call each way, and the time per call on the network vs
        on the volunteer (queued and computing); uids under ``prefix``, or all."""
        return self.loop.run(_snapshot, self.calls, prefix)

    def trust_report(self) -> dict[str, dict]:
        """Per volunteer this trainer called or a checked proof excludes: its standing (unproven,
        proven, suspect, outvoted, stale, excluded), its streak of audits passed, whether it is
        trusted, its audits passed and disagreed, its replies the guard rejected, why it was
        excluded, its standing per expert, and ``proof``: the shared verdict against it (who
        proved it, the expert, why; ``None``: none). Compared replies are audited, never
        verified; a proof is a recompute that contradicted a reply the host signed."""
        if self.loop.running:
            return self.loop.run(_report, self.trust, self.verdicts)
        return _with_proofs(self.trust.report(), self.verdicts)

    def verdict_report(self) -> dict:
        """The shared verdicts as this trainer sees them: peers excluded on a checked proof (by
        whom, the expert, why), accusations that changed nothing by why (``not_proven``,
        ``snapshot_gone``, ``unsigned``), recomputes run to check them, proofs we published and
        proofs kept for want of room in a record."""
        if self.verdicts is None:
            return {"excluded": {}, "refused": {}, "checks": 0, "published": 0, "unpublished": 0}
        return self.loop.run(_verdicts, self.verdicts) if self.loop.running else self.verdicts.snapshot()

    # --- lifetime ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Leave the swarm and stop the background thread (idempotent)."""
        if self._started and not self._done.is_set():
            async def stop() -> None:
                self._closing.set()
                with trio.move_on_after(10):
                    await self._done.wait()

            try:
                self.loop.run(stop)
            except Exception:  # closing must not raise over an error the caller is already handling
                pass
        self.loop.stop()

    def __enter__(self) -> "Swarm":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        peer = self._host.peer_id.short() if self._host is not None else "not joined"
        return f"Swarm({self.spec.name!r} as {peer})"


def _credential(cert: str | os.PathLike, keypair: KeyPair) -> bytes:
    """A trainer certificate (its text, or a file holding it) as presented on the wire; it must
    name ``keypair``'s peer (the volunteers check that too: this says it at once, in one line)."""
    from .experts.trainers import CERT_PREFIX, TrainerCertificate

    text = str(cert)
    if not text.startswith(CERT_PREFIX):
        try:
            text = Path(cert).read_text()
        except OSError as exc:
            raise VolunteerError(f"cannot read trainer certificate {cert}: {exc.strerror}") from None
    parsed = TrainerCertificate.from_text(text)
    if parsed.trainer != keypair.peer_id:
        raise VolunteerError(f"trainer certificate names {parsed.trainer.short()}, this trainer is {keypair.peer_id.short()}: "
                             "join with the key it was issued for (Swarm.join(..., keypair=...))")
    return parsed.encode()


async def _snapshot(calls, prefix: str | None) -> dict:
    return calls.snapshot(prefix)  # on the trio thread, which records the calls


async def _report(trust: TrustLedger, verdicts: "VerdictWatch | None") -> dict[str, dict]:
    return _with_proofs(trust.report(), verdicts)  # read on the loop that updates it


async def _verdicts(verdicts: "VerdictWatch") -> dict:
    return verdicts.snapshot()


def _with_proofs(report: dict[str, dict], verdicts: "VerdictWatch | None") -> dict[str, dict]:
    """The ledger's report with each peer's checked proof (``None``: none)."""
    for peer, row in report.items():
        proven = verdicts.book.proven(peer) if verdicts is not None else None
        row["proof"] = None if proven is None else {"by": proven.accuser, "uid": proven.uid, "reason": proven.reason}
    return report


__all__ = ["Swarm"]
