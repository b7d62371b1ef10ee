"""``SwarmKind``: everything that differs between swarms of different protocols, behind one plug.

A swarm file's ``kind`` (``volunteer``: ours; ``hivemind``: hivemind 1.1's wire) picks one
``SwarmKind`` from the registry (``volunteer.kinds.kind_of``), once; nothing else asks which kind
a swarm is. A kind says:

- for a volunteer, which experts its runtime starts with (``starting_backends``) and the list of
  Host services a node of that kind runs, in start order (``node_parts``), with the few of them the
  root and the status views talk to (``NodeParts``);
- for a trainer, how to join and the typed expert directory the mixture calls through
  (``join_trainer`` → ``TrainerParts``);
- for the CLI, the live experts (``list_experts``, ``volunteer experts``) and the checks of
  ``volunteer doctor`` (``doctor_plan``, ``check_peers``).

A third kind is one module implementing this protocol, plus its name in the registry and in the
swarm file parser's list of kinds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..net.multiaddr import Multiaddr
from ..net.service import HostAPI, Service
from ..swarmfile import SwarmSpec
from .options import VolunteerOptions

if TYPE_CHECKING:  # the experts, replicas and hivemind load only when a node needs them
    from ..dht import DHTConfig
    from ..dht.declare import ExpertDeclarer
    from ..dht.node import DHTNode
    from ..dht.status import DHTPanel
    from ..experts import ExpertsConfig
    from ..experts.backend import ExpertBackend
    from ..experts.directory import ExpertDirectory
    from ..experts.runtime import Runtime
    from ..experts.server import ServerStatus
    from ..hivemind.dht import HivemindDHT
    from ..hivemind.experts import HivemindServingStatus
    from ..replicas.coverage import Coverage
    from ..replicas.manager import ReplicaManager
    from .hosting import Hosting

# builds an empty backend (uid, class, hidden_dim) with the node's expert settings and checkpoints
BuildBackend = Callable[[str, str, int], "ExpertBackend"]


class ExpertServing(Protocol):
    """The service that answers a node's expert calls (ours, or hivemind's), as the root and
    the views see it: a leaving node waits until it is idle."""

    @property
    def active_requests(self) -> int: ...

    async def wait_idle(self) -> None: ...

    def snapshot(self) -> ServerStatus | HivemindServingStatus: ...


@dataclass(frozen=True)
class NodeContext:
    """What a kind builds a volunteer's services from: the running Host, the swarm, the options,
    and, on a node that hosts experts, the runtime serving them, its settings and the builder of
    more backends (placement and hand-off take experts while the node runs)."""

    host: HostAPI
    spec: SwarmSpec
    options: VolunteerOptions
    device: str = "cpu"
    runtime: "Runtime | None" = None
    experts_config: "ExpertsConfig | None" = None
    build: BuildBackend | None = None


@dataclass
class NodeParts:
    """What a kind runs for one volunteer: ``services`` in start order (each starts once the one
    before it reported started), and those of them the root and the status views talk to.
    ``dht_status()`` is the DHT panel of ``volunteer status``."""

    services: list[Service]
    dht_status: Callable[[], DHTPanel]
    server: ExpertServing | None = None
    declarer: "ExpertDeclarer | None" = None
    replicas: "ReplicaManager | None" = None
    dht: "DHTNode | None" = None  # ours; None on a swarm of another kind
    # which experts the node serves, decided here and nowhere else (the replica manager on a
    # swarm with grids); None when it hosts none
    hosting: "Hosting | None" = None


@dataclass
class TrainerParts:
    """What a trainer's join gives ``Swarm``: the directory its mixtures call through, and the
    swarm's DHT node if it has one (ours: ``DHTNode``, for the lookups ``Swarm`` offers scripts)."""

    directory: "ExpertDirectory"
    dht: "DHTNode | HivemindDHT | None" = None


@dataclass
class ExpertListing:
    """``volunteer experts``: one row per (expert, host), the table's ``columns`` (what this kind
    declares), a ``title`` naming the swarm, the grids' ``coverage`` when the kind declares
    versions, and why a listing is ``incomplete`` (None: it is not)."""

    rows: list[dict]
    title: str
    columns: tuple[str, ...]
    coverage: Coverage | None = None
    incomplete: str | None = None


@dataclass
class Check:
    """One line of ``volunteer doctor``: OK, WARN or FAIL, with what to do about it."""

    status: str  # OK, WARN, FAIL
    name: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class DoctorPlan:
    """Whom ``volunteer doctor`` checks for a swarm, and whether they serve the perf protocol."""

    peers: list[Multiaddr] = field(default_factory=list)
    perf: bool = True


class SwarmKind(Protocol):
    """One kind of swarm (see the module docstring)."""

    name: str

    def starting_backends(self, spec: SwarmSpec, options: VolunteerOptions, build: BuildBackend) -> list["ExpertBackend"]:
        """The experts a hosting node's runtime starts with (its services may add more)."""
        ...

    def node_parts(self, node: NodeContext) -> NodeParts:
        """The services a volunteer of this kind runs, in start order."""
        ...

    async def join_trainer(
        self, host: HostAPI, spec: SwarmSpec, *, dht_config: "DHTConfig | None" = None, credential: bytes | None = None
    ) -> TrainerParts:
        """Join ``spec`` as a trainer on ``host`` (services added to it); VolunteerError when
        no entry point answers."""
        ...

    async def list_experts(self, spec: SwarmSpec, prefixes: Sequence[str]) -> ExpertListing:
        """The live experts under ``prefixes``, asked of the swarm as a trainer would."""
        ...

    def doctor_plan(self, spec: SwarmSpec) -> DoctorPlan:
        """Whom ``volunteer doctor`` checks; VolunteerError when the swarm names nobody."""
        ...

    async def check_peers(self, peers: Sequence[Multiaddr]) -> list[Check]:
        """This kind's own checks of ``peers``, after the netcheck (none for ours)."""
        ...


__all__ = [
    "BuildBackend",
    "Check",
    "DoctorPlan",
    "ExpertListing",
    "ExpertServing",
    "NodeContext",
    "NodeParts",
    "SwarmKind",
    "TrainerParts",
]
