"""Where a trainer finds a swarm's experts and how it calls them: the ``ExpertDirectory``.

``RemoteMixtureOfExperts`` and ``RemoteExpert`` reach experts through the directory a swarm
carries (``swarm.directory``), as hivemind's mixture takes its ``MoEBeamSearcher``: a grid lookup
(``find_grid``) and one call (``call_expert``). Each swarm kind brings its own: ours reads the
grid's prefix records from our DHT and speaks ``/volunteer/<swarm>/experts/1.0.0``
(``client.DHTDirectory``); hivemind's reads hivemind's uid records and calls its
``ConnectionHandler`` RPCs (``volunteer.hivemind.trainer.HivemindDirectory``).

    swarm = Swarm.join("demo")               # swarm.directory is the swarm kind's directory
    moe = RemoteMixtureOfExperts(swarm, in_features=64, grid_size=(4, 4))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .config import DEFAULT_FORWARD_TIMEOUT

if TYPE_CHECKING:
    from .audit import ProofFound
    import torch

    from ..net.identity import PeerID
    from ..net.multiaddr import Multiaddr
    from ..net.service import HostAPI
    from .callstats import CallReport, CallStats
    from .faults import FaultInjection
    from .guard import ReplyGuard
    from .loop import BackgroundLoop
    from ..dht.vouches import VouchBook


class ExpertHost(Protocol):
    """One live host of an expert, as a directory's ``find_grid`` lists it."""

    @property
    def peer(self) -> "PeerID": ...

    @property
    def addrs(self) -> Sequence[bytes | str | "Multiaddr"]: ...

    @property
    def load(self) -> float: ...

    @property
    def synced_age(self) -> float | None:
        """Seconds since this replica last averaged with its peers, as declared (``None``: never,
        or a kind whose replicas do not average): how far audits let it drift from another."""
        ...


class ExpertDirectory(Protocol):
    """A swarm's experts as a trainer sees them. Both methods run on the swarm's trio loop."""

    async def find_grid(self, uid_prefix: str, grid_size: Sequence[int]) -> dict[str, list[ExpertHost]]:
        """``{uid: [live hosts, best first]}`` of the grid ``uid_prefix`` of ``grid_size``."""
        ...

    async def call_expert(
        self,
        peer: "PeerID | Multiaddr",
        uid: str,
        op: str,
        tensors: Sequence["torch.Tensor"] = (),
        *,
        n_inputs: int | None = None,
        compression: str = "none",
        timeout: float = DEFAULT_FORWARD_TIMEOUT,
        faults: "FaultInjection | None" = None,
        backward_follows: bool = False,
        kept: int | None = None,
        report: "CallReport | None" = None,
        digest: bytes | None = None,
    ) -> Any:
        """One ``info`` / ``forward`` / ``backward`` call: the info dict, or the output tensors;
        or a ``snapshot`` of the state ``digest`` a receipt named (a kind without receipts refuses).
        ``kept`` (backward): the key under which the forward's reply said the host kept its inputs
        (a kind that keeps none sends them anyway); ``report``: filled in with what the call cost."""
        ...


class TrainerSwarm(Protocol):
    """What ``RemoteExpert`` and ``RemoteMixtureOfExperts`` need of a swarm handle (``Swarm``):
    the trio loop they call through, its Host (whose peerstore learns the hosts' addresses), the
    swarm kind's directory, optional fault injection for experiments, the record of its calls
    (``calls``: where they spend their time, and what the links make auto compression pick), and
    the guard with the trainer's trust ledger, and the book of vouches it signs for its hosts."""

    @property
    def loop(self) -> "BackgroundLoop": ...

    @property
    def host(self) -> "HostAPI": ...

    @property
    def directory(self) -> ExpertDirectory: ...

    @property
    def swarm_id(self) -> str: ...

    @property
    def faults(self) -> "FaultInjection | None": ...

    @property
    def calls(self) -> "CallStats":
        """The record of this trainer's expert calls, per expert and host (``callstats.py``)."""
        ...

    @property
    def vouches(self) -> "VouchBook":
        """The tally of replies this trainer accepted, per host, that it signs as vouches."""
        ...

    @property
    def guard(self) -> "ReplyGuard":
        """The checks every reply passes (``guard.py``) with this trainer's trust ledger, shared
        by the swarm's mixtures so a host caught by one is excluded from all."""
        ...

    def publish_proof(self, proof: "ProofFound") -> None:
        """An exact audit proved a host a liar: the swarm publishes the proof for every peer to
        check (``verdicts.py``); called on the trio thread."""
        ...


__all__ = ["ExpertDirectory", "ExpertHost", "TrainerSwarm"]
