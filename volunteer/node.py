"""The one place a volunteer node is put together: ``open_volunteer(spec, options)``.

    async with open_volunteer(spec, VolunteerOptions(uids=["ffn.0.0"], expert_class="ffn")) as node:
        await node.wait_leave()          # Ctrl-C, `volunteer stop`, a test: node.leave()
    # leaving the block left gracefully: tombstones, in-flight work finished, checkpoints saved

A node is a list of parts: a Host, the runtime of its experts (when it hosts any), then the
Host services its swarm's kind lists (``kind_of(spec).node_parts``; ours, in
``volunteer/kinds/ours.py``: DHT, NAT manager, mDNS, expert server, replicas, declarer), then
``options.services``. Each service starts once the one before it reported started. A feature
for every volunteer is one more service in its kind's list; nothing here changes.

Start-up order matters for a user who watches it: listen (a busy port fails at once), reach the
swarm (no answer from any bootstrap peer or relay fails with one line), load the experts
(checkpoints resumed), then the services in order: ours start AutoNAT and relay reservations
at once (reachable first, beside the DHT's bootstrap: a slow lookup never delays them), join the
DHT (client mode while AutoNAT says private), catch grid experts up, and declare last. A clean exit from the block reverses it: tombstones first (trainers stop picking us at
once), then in-flight requests finish within a deadline (the expert server says when it is idle),
then sole replicas are handed off, then checkpoints. An exception or cancellation skips the
waiting and only tears down (a short withdraw still runs, the runtime still saves its
checkpoints).

The CLI daemon (``volunteer join``), the test fixtures and the benchmarks all start volunteers
here; ``Swarm`` beside it is the trainer's side.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import trio

from .errors import ExpertConfigError, JoinError, VolunteerError, describe
from .kinds import BuildBackend, ExpertServing, NodeContext, NodeParts, SwarmKind, kind_of
from .kinds.entry import reach_swarm
from .kinds.options import VolunteerOptions
from .net.host import Host
from .net.identity import KeyPair
from .net.resources import ResourceLimits, ResourceManager
from .net.service import Service
from .net.stack import open_stack
from .settings import EXPERT_LIMITS
from .swarmfile import SwarmSpec

if TYPE_CHECKING:  # the experts (and torch) load only when a node hosts experts
    from .dht.declare import ExpertDeclarer
    from .experts.judge import TrainersStatus
    from .dht.node import DHTNode
    from .experts import ExpertsConfig
    from .experts.runtime import Runtime
    from .experts.stats import ExpertStats
    from .replicas import HandOffResult
    from .replicas.manager import ReplicaManager

log = logging.getLogger(__name__)

WITHDRAW_DEADLINE = 3.0  # tombstones that have not reached the DHT by then are left to expire
WITHDRAW_ON_ERROR = 2.0  # an exception or cancellation spends at most this on tombstones


def check_device(device: str, max_gpu_memory: float | None) -> str:
    """Resolve ``auto`` and refuse a CUDA device torch cannot see, with what to do instead."""
    import torch

    from .experts.backend import resolve_device

    resolved = resolve_device(device)
    if resolved.type in ("mps", "xpu"):  # another platform's GPU: say so before torch fails deep inside
        backend = getattr(torch.backends, "mps", None) if resolved.type == "mps" else getattr(torch, "xpu", None)
        if backend is None or not backend.is_available():
            raise JoinError(f"no {resolved.type.upper()} device here (this torch cannot use one); "
                            "use --device cpu, cuda or auto")
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = resolved.index or 0
        if index >= count:
            raise JoinError(f"no CUDA device {resolved} (torch sees {count} CUDA device(s)); use --device cpu or auto")
        if max_gpu_memory:
            torch.cuda.set_per_process_memory_fraction(max_gpu_memory, index)
    return str(resolved)


@dataclass(frozen=True)
class Finished:
    """What ``VolunteerNode.finish`` did (``volunteer.donor.control.Finished``)."""

    drained: bool  # in-flight calls done before the deadline
    handed_off: int = 0  # sole copies handed to other volunteers
    kept: int = 0  # sole copies no one took (their checkpoints keep them)
    saved: int = 0  # checkpoints saved


class VolunteerNode:
    """A running volunteer, as ``open_volunteer`` yields it: its Host, runtime (None when it
    hosts no experts) and its kind's parts (``parts``: the services, and those the status views
    read), ``pause`` / ``resume`` / ``leave``, and the donor layer's verbs (it implements
    ``volunteer.donor.control.NodeControl``, each verb through the part that owns the fact)."""

    def __init__(
        self, spec: SwarmSpec, options: VolunteerOptions, host: Host, kind: SwarmKind, parts: NodeParts,
        runtime: "Runtime | None" = None, device: str = "cpu",
    ) -> None:
        self.spec = spec
        self.options = options
        self.host = host
        self.kind = kind
        self.parts = parts
        self.runtime = runtime
        self.device = device
        self.handed_off: HandOffResult | None = None  # what the graceful leave handed off
        self._paused = False
        self._leave = trio.Event()

    # --- the parts the views and tests read ------------------------------------------------------
    @property
    def dht(self) -> "DHTNode | None":
        """Our DHT node (None on a swarm of another kind)."""
        return self.parts.dht

    @property
    def server(self) -> ExpertServing | None:
        """The service answering expert calls (None when the node hosts no experts)."""
        return self.parts.server

    @property
    def declarer(self) -> "ExpertDeclarer | None":
        """Our declarer (None without experts, or on a swarm of another kind)."""
        return self.parts.declarer

    @property
    def replicas(self) -> "ReplicaManager | None":
        """Grid experts: placement, catch-up, sync, hand-off (None when the swarm has no grid)."""
        return self.parts.replicas

    # --- lifecycle -------------------------------------------------------------------------------
    def leave(self) -> None:
        """Ask the node to leave gracefully (Ctrl-C, SIGTERM, ``volunteer stop``); see ``wait_leave``."""
        self._leave.set()

    async def wait_leave(self) -> None:
        """Until ``leave()`` is called: the body of ``open_volunteer`` waits here, then exits."""
        await self._leave.wait()

    @property
    def leaving(self) -> bool:
        """Whether a graceful leave was asked for."""
        return self._leave.is_set()

    @property
    def paused(self) -> bool:
        """Whether the node refuses calls and has withdrawn its experts (``pause`` / ``resume``)."""
        return self._paused

    async def pause(self, *, quiet: bool = False) -> None:
        """Stop taking expert requests and drop out of lookups at once; keep identity and
        connections. ``quiet``: no log line (a node that starts paused says so itself)."""
        self._paused = True
        if self.runtime is not None:
            self.runtime.pause()
        if self.declarer is not None:
            await self.declarer.pause()
        if self.replicas is not None:
            self.replicas.pause()  # quiet: no sync rounds, surveys or re-checks while paused
        if not quiet:
            log.warning("paused: experts withdrawn from the DHT, new requests refused")

    def resume(self, *, quiet: bool = False) -> None:
        """Take requests and declare the experts again. ``quiet``: no log line (the donor's
        steward logs its own notice of the fold)."""
        self._paused = False
        if self.runtime is not None:
            self.runtime.resume()
        if self.declarer is not None:
            self.declarer.resume()
        if self.replicas is not None:
            self.replicas.resume()
        if not quiet:
            log.warning("resumed: experts declared again")

    # --- the donor layer's verbs (volunteer.donor.control.NodeControl) ----------------------------
    @property
    def entry_points(self) -> int:
        """How many bootstrap peers and relays ``redial`` dials (0 on a kind without our DHT)."""
        return len(self.spec.entry_points) if self.dht is not None else 0

    @property
    def heartbeat_period(self) -> float | None:
        """Seconds between our declarations; None where no declarer of ours can be looked up."""
        if self.dht is None or self.declarer is None:
            return None
        return self.dht.config.expert_update_period

    def connected_peers(self) -> int:
        """Distinct peers connected now."""
        return sum(1 for peer in {c.remote_peer for c in self.host.connections()} if self.host.is_connected(peer))

    def hosted(self) -> frozenset[str]:
        """The uids served now, as the kind's one ``Hosting`` decides them."""
        hosting = self.parts.hosting
        return hosting.hosted() if hosting is not None else frozenset()

    async def set_aside(self, uid: str) -> bool:
        """Withdraw ``uid`` and keep it to take back, through the kind's ``Hosting`` (the replica
        manager on a swarm with grids, so placement does not put another in its place)."""
        hosting = self.parts.hosting
        return await hosting.set_aside(uid) if hosting is not None else False

    def take_back(self, uids: Sequence[str]) -> list[str]:
        """Serve and declare again those of ``uids`` set aside."""
        hosting = self.parts.hosting
        return hosting.take_back(uids) if hosting is not None else []

    async def hand_off(self) -> tuple[int, int] | None:
        """Hand off sole copies (the replica manager's ``hand_off_all``): (handed off, could not
        be); None without replicas."""
        if self.replicas is None:
            return None
        self.handed_off = result = await self.replicas.hand_off_all()
        return len(result.done), len(result.failed)

    async def finish(self, deadline: float) -> Finished:
        """Drain in-flight calls within ``deadline``, hand off sole copies and save checkpoints,
        as a graceful leave does, but stay in the swarm (paused by the caller)."""
        drained = await self._drain(deadline)
        moved = await self.hand_off()
        handed, kept = moved if moved is not None else (0, 0)
        return Finished(drained=drained, handed_off=handed, kept=kept, saved=await self._save_checkpoints())

    async def visible(self) -> bool | None:
        """Whether the peers closest to our first declared expert's key hold our record (a
        trainer's lookup would find us); None before anything is declared, or on another kind."""
        from .dht.grid import expert_key

        dht, declarer = self.dht, self.declarer
        if dht is None or declarer is None or not declarer.uids or not declarer.declarations:
            return None
        uid = declarer.uids[0]
        try:
            return await dht.held_elsewhere(expert_key(uid), self.host.peer_id.to_bytes()) > 0
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            log.info("looking up our own expert %s failed: %s", uid, describe(exc))
            return False

    async def redial(self) -> int | None:
        """Re-dial the bootstrap peers and relays and bootstrap the DHT again: how many answered
        (None on a kind without our DHT)."""
        if self.dht is None:
            return None
        try:
            return await self.dht.bootstrap(self.spec.entry_points)
        except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
            log.warning("re-dialling the swarm failed: %s", describe(exc))
            return 0

    async def rejoin(self) -> int | None:
        """``redial``, then declare at once rather than a heartbeat later."""
        answered = await self.redial()
        if answered is not None and self.declarer is not None and not self.declarer.paused:
            self.declarer.resume()
        return answered

    # --- typed facts the daemon, its views and metrics read ----------------------------------------
    @property
    def hosts_experts(self) -> bool:
        """Whether the node runs experts (a runtime)."""
        return self.runtime is not None

    def expert_stats(self) -> "dict[str, ExpertStats]":
        """Each served expert's counters, by uid (empty without experts)."""
        return self.runtime.stats() if self.runtime is not None else {}

    def expert_on_gpu(self, uid: str) -> bool:
        """Whether expert ``uid`` computes on a CUDA device."""
        backend = self.runtime.backends.get(uid) if self.runtime is not None else None
        return backend is not None and backend.device.type == "cuda"

    def trainer_report(self) -> "TrainersStatus | None":
        """Who trains our experts and how it went (the runtime's report); None without experts."""
        return self.runtime.trainer_report() if self.runtime is not None else None

    def swarm_dhts(self) -> "dict[str, DHTNode]":
        """Our DHT node by swarm id, for the metrics (empty on a swarm of another kind)."""
        return {self.spec.id: self.dht} if self.dht is not None else {}

    # --- leaving ---------------------------------------------------------------------------------
    async def _drain(self, deadline: float) -> bool:
        """Refuse new calls and wait (at most ``deadline``) for the running ones; True when they
        finished in time."""
        if self.runtime is None:
            return True
        self.runtime.pause()
        if self.server is None:
            return True
        with trio.move_on_after(deadline) as scope:
            await self.server.wait_idle()
        return not scope.cancelled_caught

    async def _save_checkpoints(self) -> int:
        runtime = self.runtime
        if runtime is None:
            return 0
        saved = 0
        for backend in list(runtime.backends.values()):
            if backend.checkpoint_path is None:
                continue
            try:
                await runtime.run_sync(backend.save_checkpoint)
                saved += 1
            except (VolunteerError, OSError) as exc:
                log.warning("could not save the checkpoint of %s: %s", backend.uid, describe(exc))
        return saved

    async def _leave_gracefully(self) -> None:
        # vanish from lookups, refuse new work, let running work finish (checkpoints come after)
        if self.declarer is not None:
            with trio.move_on_after(WITHDRAW_DEADLINE):
                await self.declarer.withdraw()
        await self._drain(self.options.leave_deadline)
        # sole copies go to volunteers with room (bounded by handoff_timeout); the runtime's exit
        # saves every checkpoint afterwards, handed off or not
        await self.hand_off()

    async def _withdraw_quickly(self) -> None:
        # an exception or cancellation: tombstones while connections are still up, briefly
        if self.declarer is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(WITHDRAW_ON_ERROR):
            try:
                await self.declarer.withdraw()
            except (VolunteerError, OSError, trio.BrokenResourceError) as exc:
                log.warning("withdrawing experts failed: %s", describe(exc))

    def __repr__(self) -> str:
        return f"VolunteerNode({self.spec.name!r} as {self.host.peer_id.short()})"


@asynccontextmanager
async def open_volunteer(spec: SwarmSpec, options: VolunteerOptions | None = None) -> AsyncIterator[VolunteerNode]:
    """Run a volunteer node of swarm ``spec`` for the block's lifetime (see the module docstring).

    Raises JoinError when the swarm cannot be reached or the experts cannot be built."""
    opts = options or VolunteerOptions()
    kind = kind_of(spec)
    device = "cpu"
    if opts.experts_config is not None:
        device = str(opts.experts_config.device)
    elif opts.hosts_experts:
        device = check_device(opts.device, opts.max_gpu_memory)
        for other in opts.devices:
            check_device(other, opts.max_gpu_memory)
    resource_limits = {k: v for k, v in opts.limits.items() if k not in EXPERT_LIMITS}
    host_services: list[Service] = [ResourceManager(ResourceLimits(**resource_limits))] if resource_limits else []
    keypair = opts.keypair or KeyPair.generate()
    async with open_stack(keypair, opts.listen, options=opts.stack, config=opts.host_config, services=host_services) as host:
        await reach_swarm(host, spec)
        async with _open_experts(kind, spec, opts, device) as (runtime, config, build):
            parts = kind.node_parts(NodeContext(host, spec, opts, device, runtime, config, build))
            node = VolunteerNode(spec, opts, host, kind, parts, runtime, device)
            try:
                if opts.start_paused:  # a first start without the donor's consent: nothing is announced
                    await node.pause(quiet=True)
                for service in [*parts.services, *opts.services]:
                    await host.add_service(service)
                yield node
            except BaseException:
                await node._withdraw_quickly()
                raise
            await node._leave_gracefully()
        # leaving the runtime's block saved every checkpoint


@asynccontextmanager
async def _open_experts(
    kind: SwarmKind, spec: SwarmSpec, opts: VolunteerOptions, device: str
) -> AsyncIterator[tuple["Runtime | None", "ExpertsConfig | None", BuildBackend | None]]:
    """The runtime of a node that hosts experts, with the backends its kind starts with (or those
    the options hand over), its settings and the builder of more; (None, None, None) otherwise."""
    if not opts.hosts_experts:
        yield None, None, None
        return
    from .experts import ExpertsConfig, load_expert_file
    from .experts.backend import ExpertBackend, make_backend
    from .experts.runtime import open_runtime

    if opts.expert_file:
        load_expert_file(opts.expert_file)
    if opts.cpu_threads:  # the donor's share of the CPU: torch would take every core
        import torch

        torch.set_num_threads(opts.cpu_threads)
    expert_limits = {k: v for k, v in opts.limits.items() if k in EXPERT_LIMITS}
    config = opts.experts_config or ExpertsConfig(
        device=device, max_batch_size=opts.max_batch, share_tracebacks=opts.share_tracebacks, **expert_limits
    )
    if spec.receipts and not config.receipts:  # the swarm asks for exact audits: receipts on every reply
        config = replace(config, receipts=True)
    if opts.place and not spec.grids:
        raise JoinError(f"swarm {spec.name!r} declares no [[grid]]: pass --experts CLASS:PATTERN")
    if opts.backends is None and opts.expert_class is None and not spec.grids:  # grids name their class
        raise JoinError("cannot build experts: no expert class given (e.g. --experts ffn:expert.[0:4])")

    configs = {device: replace(config, device=device) for device in opts.devices}
    placed: dict[str, str] = {}  # uid -> the device its backend was built on

    def build(uid: str, cls: str, hidden: int) -> ExpertBackend:
        own = config
        if configs:  # one daemon, several GPUs: each new expert goes where fewest are
            device = placed.get(uid) or min(configs, key=lambda d: sum(1 for v in placed.values() if v == d))
            placed[uid] = device
            own = configs[device]
        return make_backend(uid, cls, hidden, config=own, checkpoint_dir=opts.checkpoint_dir)

    try:
        backends = list(opts.backends) if opts.backends is not None else kind.starting_backends(spec, opts, build)
    except (ExpertConfigError, KeyError, ValueError) as exc:
        raise JoinError(f"cannot build experts: {describe(exc)}") from None
    async with open_runtime(backends, config) as runtime:
        yield runtime, config, build


__all__ = ["Finished", "JoinError", "VolunteerNode", "VolunteerOptions", "check_device", "open_volunteer"]
