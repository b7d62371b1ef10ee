"""Replica sync ``/volunteer/<swarm>/expert-sync/1.0.0``: the trio driver of ``SyncRound``.

``ReplicaSync`` is a Host service. ``average(uid, peers)`` opens a round, sends our parameters to
every peer (one stream each, in parallel), and waits until every peer contributed or is gone (its
send failed, it refused, or its last connection closed) or the round's deadline passes; then the
store has the runtime judge and aggregate what arrived with our own parameters (``guard.py``,
then ``aggregate.py``: CenteredClip by default) and write the result into the expert, as a job beside its forwards and backwards. A
contribution that arrives before our own round opens (the peers' timers are not aligned) waits
``stash_ttl`` for it, within ``max_stashed_bytes``. A replica that dies mid-round never stalls
the others: nobody waits for it longer than ``sync_timeout``, and usually only until its
connection drops. What arrived is a claim: the ``SyncGuard`` (``guard.py``) refuses non-finite
contributions, those farther than the learned honest drift and steady pushers, decides the version
after the round, and ``refusals`` counts its refusals by reason. Hashing and encoding big parameters runs in a thread and the aggregate on the
runtime: the event loop only moves bytes.
"""

from __future__ import annotations

import logging
from collections import Counter
from hashlib import sha256
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence, TypeVar

import torch
import trio

from ..errors import VolunteerError, describe
from ..experts.standing import Standing
from ..net.events import PeerDisconnected
from ..net.identity import PeerID
from ..net.multiaddr import Multiaddr
from ..net.service import BaseService, Handler, HostAPI
from ..net.streams import BufferedStream, close_quietly
from ..net.upload import SYNC, UploadMeter
from .aggregate import Aggregate, robust
from .config import DEFAULT_CONFIG, ReplicasConfig
from .errors import StateMismatchError, StateProtocolError, StateRefusedError, SyncError
from .exclusions import NO_EXCLUSIONS, PROVEN_LIAR, Exclusions
from .guard import NONFINITE, SyncGuard, Verdict
from .messages import Contribution, check_reply, chunked, encode_tensors, pack, refusal, split_payload, sync_protocol
from .store import BackendStore
from .sync import SyncOutcome, SyncRound
from .transfer import receive_message, receive_payload, send_chunks

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_STANDINGS = 4096  # (uid, peer) standings remembered, oldest forgotten first


@dataclass
class _Stashed:
    arrived: float
    version: int
    tensors: dict[str, torch.Tensor]
    nbytes: int


class _OpenRound:
    def __init__(self, core: SyncRound) -> None:
        self.core = core
        self.changed = trio.Event()

    def poke(self) -> None:
        self.changed.set()


def _open_contribution(header: Contribution, payload: bytes | bytearray) -> dict[str, torch.Tensor]:
    """A contribution's tensors, once its payload matches its sha256."""
    if sha256(payload).digest() != header.sha256:
        raise StateProtocolError(f"sync contribution for {header.uid!r} does not match its sha256")
    return split_payload(header.tensors, payload)


def peer_of(target: PeerID | Multiaddr | str) -> PeerID:
    """The PeerID a sync target names (a PeerID, or a multiaddr ending in /p2p/ID)."""
    if isinstance(target, PeerID):
        return target
    addr = target if isinstance(target, Multiaddr) else Multiaddr(str(target))
    peer = addr.peer_id
    if peer is None:
        raise SyncError(f"sync target {target} names no peer (/p2p/...)")
    return peer


class ReplicaSync(BaseService):
    """Averages hosted experts' parameters with their other live replicas (``aggregate``: how a
    round's contributions and ours become new parameters)."""

    def __init__(
        self,
        swarm_id: str,
        store: BackendStore,
        config: ReplicasConfig = DEFAULT_CONFIG,
        *,
        aggregate: Aggregate = robust,
        guard: SyncGuard | None = None,
        upload: UploadMeter | None = None,
        exclusions: Exclusions = NO_EXCLUSIONS,
    ) -> None:
        self.protocol = sync_protocol(swarm_id)
        # peers a checked proof excludes: never a partner, and their contributions are refused
        self.exclusions = exclusions
        self.upload = upload  # the volunteer's shared upload cap: contributions count against it
        self.store = store
        self.config = config
        self.aggregate = aggregate
        self.guard = guard if guard is not None else SyncGuard(config)
        self.refusals: Counter[str] = Counter()  # contributions the guard refused, by reason
        # (uid, peer) → its standing after its last contribution (ReplicaManager.standings)
        self.standings: dict[tuple[str, str], Standing] = {}
        self._rounds: dict[str, _OpenRound] = {}
        self._stash: dict[str, dict[str, _Stashed]] = {}
        self._stashed_bytes = 0
        self.last_sync: dict[str, float] = {}  # uid → trio time its state last matched its replicas'
        self.rounds = 0
        self.refused = 0

    def handlers(self) -> dict[str, Handler]:
        return {self.protocol: self._serve}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        async with host.events.subscribe(PeerDisconnected) as events:
            task_status.started()
            async for event in events:
                if isinstance(event, PeerDisconnected) and not host.is_connected(event.peer):
                    for open_round in self._rounds.values():
                        open_round.core.gone(str(event.peer))
                        open_round.poke()

    # --- inbound contributions -------------------------------------------------------------
    async def _serve(self, stream: Any) -> None:
        reader = BufferedStream(stream)
        peer = str(stream.remote_peer)
        try:
            if self.exclusions.excluded(peer):
                self.refusals[PROVEN_LIAR] += 1
                raise StateRefusedError("a checked proof excludes this peer", PROVEN_LIAR)
            with trio.fail_after(self.config.request_timeout):
                header = Contribution.from_wire(await receive_message(reader, self.config, "sync contribution"), self.config)
            if set(header.tensors) != set(self.store.parameter_layout(header.uid)):
                raise StateMismatchError(f"parameters of {header.uid!r} differ from this replica's")
            with trio.fail_after(self.config.transfer_timeout):
                payload = await receive_payload(reader, header.total, self.config)
            self._deliver(peer, header, await self._off_the_loop(header.total, _open_contribution, header, payload))
            await reader.send_all(pack({"ok": True}, self.config))
        except (StateRefusedError, StateProtocolError, SyncError) as exc:
            self.refused += 1
            code = exc.code if isinstance(exc, StateRefusedError) else "error"
            log.debug("sync contribution from %s refused: %s", stream.remote_peer.short(), describe(exc))
            try:
                await reader.send_all(pack(refusal(code, str(exc)), self.config))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # too slow or gone: it is missing from our round, which is fine
        finally:
            await close_quietly(reader)

    def _deliver(self, peer: str, header: Contribution, tensors: dict[str, torch.Tensor]) -> None:
        open_round = self._rounds.get(header.uid)
        if open_round is not None and peer in open_round.core.members and not open_round.core.finished:
            open_round.core.add(peer, header.version, tensors)
            open_round.poke()
            return
        now = trio.current_time()
        self._expire_stash(now)
        stash = self._stash.setdefault(header.uid, {})
        old = stash.pop(peer, None)
        if old is not None:
            self._stashed_bytes -= old.nbytes
        if self._stashed_bytes + header.total > self.config.max_stashed_bytes or len(stash) >= self.config.max_group:
            raise StateRefusedError("too many early sync contributions waiting", "busy")
        stash[peer] = _Stashed(now, header.version, tensors, header.total)
        self._stashed_bytes += header.total

    def _expire_stash(self, now: float) -> None:
        for uid in list(self._stash):
            stash = self._stash[uid]
            for peer in [p for p, s in stash.items() if now - s.arrived > self.config.stash_ttl]:
                self._stashed_bytes -= stash.pop(peer).nbytes
            if not stash:
                del self._stash[uid]

    async def _off_the_loop(self, nbytes: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, tensor bytes work on ``nbytes``: in a thread from ``offload_bytes`` on
        (hashing and copying tens of MiB would stall every other task), else right here."""
        if nbytes >= self.config.offload_bytes:
            return await trio.to_thread.run_sync(fn, *args)
        return fn(*args)

    # --- our rounds ------------------------------------------------------------------------------
    async def average(
        self, uid: str, peers: Sequence[PeerID | Multiaddr | str], *, timeout: float | None = None
    ) -> SyncOutcome:
        """One round of averaging ``uid`` with ``peers`` (its other live replicas, as found in the
        DHT); returns what happened. Ends within ``timeout`` (``sync_timeout``) whatever the peers do."""
        if uid in self._rounds:
            raise SyncError(f"a sync round of {uid!r} is already running")
        if self.store.suspect(uid):  # no reference for the others until its trainer is cleared or refused
            raise SyncError(f"{uid!r} took gradients past its bound lately: it sits out this round")
        me = str(self.host.peer_id)
        targets: dict[str, PeerID | Multiaddr | str] = {}
        for target in peers:
            target_id = str(peer_of(target))
            if target_id != me and not self.exclusions.excluded(target_id):
                targets.setdefault(target_id, target)
        # our lineage first: identities are free, and a crowd of them must not push the peers
        # we loaded from out of a group of max_group
        ranked = sorted(targets.items(), key=lambda item: not self.guard.established(uid, item[0]))
        targets = dict(ranked[: self.config.max_group - 1])
        version, params = await self.store.parameters(uid)
        now = trio.current_time()
        core = SyncRound(uid, me, targets, version, params, now=now, timeout=timeout or self.config.sync_timeout)
        open_round = self._rounds[uid] = _OpenRound(core)
        dropped: VolunteerError | None = None
        try:
            self._expire_stash(now)
            for peer, early in list(self._stash.get(uid, {}).items()):
                if peer in core.members:
                    del self._stash[uid][peer]
                    self._stashed_bytes -= early.nbytes
                    try:
                        core.add(peer, early.version, early.tensors)
                    except (SyncError, StateMismatchError) as exc:
                        log.debug("early sync contribution of %s dropped: %s", peer, describe(exc))
            nbytes = sum(t.nelement() * t.element_size() for _, t in params)
            metas, parts, sha = await self._off_the_loop(nbytes, encode_tensors, params)
            header = Contribution(uid, version, metas, sum(len(p) for p in parts), sha)
            chunks = chunked(parts, self.config.chunk_size)
            async with trio.open_nursery() as nursery:
                for peer, target in targets.items():
                    nursery.start_soon(self._send, open_round, peer, target, header, chunks)
                with trio.move_on_at(core.deadline):
                    while not core.done(trio.current_time()):
                        await open_round.changed.wait()
                        open_round.changed = trio.Event()
                outcome = core.finish()
                self._rounds.pop(uid, None)
                try:
                    verdict = await self.store.merge(uid, core.params, core.contributions, self.guard, self.aggregate)
                except StateRefusedError as exc:
                    # dropped (a re-check moved it, a hand-off took it) while its round ran: raised
                    # past the nursery, where the caller sees a plain error, not an exception group
                    dropped = exc
                else:
                    outcome = self._settle(uid, outcome, verdict)
                # the nursery now waits for our sends still under way: the peers' rounds need our
                # parameters even when theirs all reached us first (each send ends at the deadline)
        finally:
            self._rounds.pop(uid, None)
        if dropped is not None:
            raise SyncError(f"{uid!r} was dropped during its sync round: {describe(dropped)}")
        self.rounds += 1
        return outcome

    def _settle(self, uid: str, outcome: SyncOutcome, verdict: Verdict) -> SyncOutcome:
        """What a merged round teaches: refused peers' and accepted peers' standings, our alignment."""
        for peer, reason in sorted(verdict.refused.items()):
            self.refusals[reason] += 1
            self._stand(uid, peer, Standing.EXCLUDED if reason == NONFINITE else Standing.SUSPECT)
            log.warning("sync of %s: %s's contribution refused (%s)", uid, peer[-10:], reason)
        for peer in verdict.accepted:
            self._stand(uid, peer, Standing.PROVEN)
        if verdict.accepted or verdict.unvouched:
            # a round that merged nobody and found nobody within the drift (every peer late, gone
            # or refused) left our state where it was: declaring it freshly synced would have
            # audits compare it with a tolerance its drift may exceed. Peers without standing
            # with us (they follow our lineage) were within it: we are aligned with them
            self.aligned(uid)
        return replace(outcome, version=verdict.version, refused=tuple(sorted(verdict.refused.items())))

    def aligned(self, uid: str) -> None:
        """``uid``'s state matches its replicas' as of now: a round finished, or it was just
        caught up from a replica (loaded that replica's state whole). Its declared sync age, which
        lets trainers' audits compare it with another replica, counts from here."""
        self.last_sync[uid] = trio.current_time()

    def forget(self, uid: str) -> None:
        """We no longer host ``uid``: a later copy of it is aligned by its own catch-up or round,
        never by this one's, and its rounds' guard learns its drift afresh."""
        self.last_sync.pop(uid, None)
        self.guard.forget(uid)

    def _stand(self, uid: str, peer: str, standing: Standing) -> None:
        self.standings.pop((uid, peer), None)  # re-inserted: the oldest stays first to forget
        self.standings[(uid, peer)] = standing
        while len(self.standings) > MAX_STANDINGS:
            del self.standings[next(iter(self.standings))]

    async def _send(self, open_round: _OpenRound, peer: str, target: Any, header: Contribution, chunks: list) -> None:
        core = open_round.core
        try:
            with trio.move_on_at(core.deadline):
                stream = BufferedStream(await self.host.new_stream(target, [self.protocol]))
                try:
                    await stream.send_all(pack(header.to_wire(), self.config))
                    await send_chunks(stream, chunks, self.upload, SYNC)
                    check_reply(await receive_message(stream, self.config, "sync reply"))
                finally:
                    await close_quietly(stream)
        except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            # it will not take ours, so it is not syncing this expert with us: stop waiting for it
            log.debug("sync of %s with %s failed: %s", core.uid, peer, describe(exc))
            core.gone(peer)
            open_round.poke()


__all__ = ["ReplicaSync", "peer_of"]
