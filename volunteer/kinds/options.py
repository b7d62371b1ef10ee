"""``VolunteerOptions``: everything a volunteer node is started with, besides the swarm it joins.

It sits with the swarm kinds (below ``node``) because each kind builds its node's services from
it; ``volunteer.node`` re-exports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..dht import DHTConfig
from ..net.config import HostConfig
from ..net.identity import KeyPair
from ..net.multiaddr import Multiaddr
from ..net.service import Service
from ..net.stack import StackOptions

if TYPE_CHECKING:  # the experts (and torch) load only when a node hosts experts
    from ..experts import ExpertsConfig
    from ..experts.backend import ExpertBackend
    from ..experts.server import OutcomeHook, ServedHook
    from ..replicas import ReplicasConfig

LEAVE_DEADLINE = 10.0  # in-flight expert requests get this long to finish on a graceful leave


@dataclass
class VolunteerOptions:
    """Everything a volunteer node is started with, besides the swarm it joins."""

    keypair: KeyPair | None = None  # default: a fresh identity
    listen: list[str] = field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"])
    host_config: HostConfig | None = None
    stack: StackOptions | None = None  # default: every standard service (NAT wing, perf...)
    # config.toml's [limits]: ResourceLimits fields and the expert server's request budget
    limits: dict = field(default_factory=dict)
    dht_config: DHTConfig | None = None  # default: DHTConfig(swarm_id=spec.id)
    nat: bool = True  # AutoNAT probes and relay reservations
    nat_servers: list[Multiaddr] | None = None  # default: the swarm's entry points
    mdns: bool = True  # find volunteers of the same swarm on the LAN
    # experts: built from (expert_class, uids, hidden_dim), or handed over ready-made in backends
    expert_class: str | None = None
    uids: list[str] = field(default_factory=list)
    hidden_dim: int = 64
    device: str = "auto"
    devices: list[str] = field(default_factory=list)  # several CUDA devices: experts spread over them
    cpu_threads: int | None = None  # threads torch computes with on the CPU (None: torch's default, every core)
    max_batch: int = 1024
    checkpoint_dir: Path | None = None
    max_gpu_memory: float | None = None  # fraction of the GPU's memory torch may take
    max_ram: int | None = None  # bytes of this machine's memory the experts may take on the CPU (--max-ram)
    max_upload: float | None = None  # bytes per second of all this volunteer uploads (replies and replica traffic)
    expert_file: str | None = None  # a Python file defining custom expert classes
    share_tracebacks: str = "redacted"  # what our expert errors show trainers: full, redacted, none
    experts_config: "ExpertsConfig | None" = None  # default: from device and max_batch
    backends: "Sequence[ExpertBackend] | None" = None
    leave_deadline: float = LEAVE_DEADLINE
    # replicated experts (the swarm file's [[grid]]): place=True picks uids by automatic placement
    place: bool = False
    start_paused: bool = False  # serve nothing until resume(): experts loaded, never declared before
    max_experts: int | None = None  # placement capacity (default: what fits the GPU, else 8)
    replicas_config: "ReplicasConfig | None" = None  # default: replicas.DEFAULT_CONFIG
    public_name: str | None = None  # shown on the swarm's public health pages (opt-in: None hides us)
    # told of each expert call answered with a result, (caller, op): the CLI counts trainers with it
    on_served: "ServedHook | None" = None
    # told of each expert call's outcome, (uid, error or None): the CLI sets aside a failing expert
    on_outcome: "OutcomeHook | None" = None
    # services of your own, run after the swarm kind's (each gets the Host in its ``run``)
    services: Sequence[Service] = ()

    @property
    def hosts_experts(self) -> bool:
        """Whether this node serves experts at all (a node without them still routes the DHT)."""
        return bool(self.uids) or bool(self.backends) or self.place


__all__ = ["LEAVE_DEADLINE", "VolunteerOptions"]
