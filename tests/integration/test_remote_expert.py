"""RemoteExpert and BackgroundLoop from plain synchronous code, without a DHT or a Swarm: a client
host and a server host share one background loop on the in-memory transport. Forward and
backward equal a local copy of the module, a killed peer is ExpertUnavailableError, a handler that
never answers is ExpertTimeoutError within the (small) timeout, and the loop itself hides trio."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
import trio

from volunteer.errors import ExpertTimeoutError, ExpertUnavailableError, VolunteerError
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.experts.callstats import CallStats
from volunteer.experts.client import RemoteExpert
from volunteer.experts.loop import BackgroundLoop
from volunteer.experts.client import DHTDirectory
from volunteer.experts.protocol import protocol_id
from volunteer.experts.server import ExpertServer
from volunteer.dht.vouches import Ledger, VouchBook
from volunteer.net.identity import KeyPair
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.transport.memory import MemoryNetwork, MemoryTransport

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
SWARM = "rx"
CONFIG = ExpertsConfig(device="cpu")


class Node:
    """A host (optionally serving ffn experts) living in ``loop`` until ``kill``."""

    def __init__(self, loop: BackgroundLoop, network: MemoryNetwork, uids=(), hidden: int = 8) -> None:
        self.loop, self.network, self.uids, self.hidden = loop, network, list(uids), hidden
        self.runtime = None
        self.calls = CallStats()
        self.keypair = KeyPair.generate()
        self.vouches = VouchBook(self.keypair, SWARM, time.time())
        self.loop.run(self._start, timeout=10)

    async def _start(self) -> None:
        self._ready, self._stop, self._done = trio.Event(), trio.Event(), trio.Event()
        trio.lowlevel.spawn_system_task(self._main)
        await self._ready.wait()

    async def _main(self) -> None:
        try:
            transports = [MemoryTransport(self.network)]
            async with open_stack(self.keypair, listen=["/memory/0"], transports=transports, options=QUIET) as host:
                self.host = host
                self.directory = DHTDirectory(host, None, SWARM)  # calls known peers: no DHT
                if self.uids:
                    backends = [make_backend(uid, "ffn", self.hidden, config=CONFIG) for uid in self.uids]
                    async with open_runtime(backends, CONFIG) as runtime:
                        self.runtime = runtime
                        self.server = ExpertServer(host, runtime, SWARM, CONFIG)
                        await host.add_service(self.server)
                        self._ready.set()
                        await self._stop.wait()
                else:
                    self._ready.set()
                    await self._stop.wait()
        finally:
            self._ready.set()
            self._done.set()

    # what RemoteExpert needs of a swarm (experts.directory.TrainerSwarm): .loop, .host, .directory,
    # .swarm_id, .faults, .calls, .vouches (set in __init__)
    swarm_id = SWARM
    faults = None

    @property
    def addr(self):
        return self.host.full_addrs()[0]

    def kill(self) -> None:
        async def stop() -> None:
            self._stop.set()
            await self._done.wait()

        self.loop.run(stop, timeout=10)


@pytest.fixture
def world():
    with BackgroundLoop() as loop:
        network = MemoryNetwork()
        server = Node(loop, network, ["ffn.0", "ffn.1"])
        client = Node(loop, network)
        try:
            yield loop, server, client
        finally:
            server.kill()
            client.kill()


def test_forward_backward_from_a_plain_thread_match_a_local_copy(world):
    _, server, client = world
    torch.manual_seed(0)
    local = copy.deepcopy(server.runtime.backends["ffn.0"].module)
    results: dict = {}

    def trainer() -> None:  # an ordinary thread, as a PyTorch training loop would be
        remote = RemoteExpert("ffn.0", server.addr, client, forward_timeout=5, backward_timeout=5, compression="none")
        x = torch.randn(6, 8, requires_grad=True)
        y = remote(x)
        weights = torch.randn(6, 8)
        (y * weights).sum().backward()
        results.update(x=x.detach(), y=y.detach(), grad=x.grad, weights=weights, info=remote.info)

    thread = threading.Thread(target=trainer)
    thread.start()
    thread.join(15)
    assert not thread.is_alive() and "grad" in results
    x_local = results["x"].clone().requires_grad_()
    y_local = local(x_local)
    (y_local * results["weights"]).sum().backward()
    assert torch.allclose(results["y"], y_local.detach(), atol=1e-5)
    assert torch.allclose(results["grad"], x_local.grad, atol=1e-5)
    assert results["info"]["outputs"][0]["s"] == [8]
    assert server.runtime.backends["ffn.0"].updates == 1  # backward made the server step
    assert server.server.bytes_in > 0 and server.server.bytes_out > 0


def test_each_accepted_receipted_reply_counts_toward_the_hosts_vouch(world):
    """The trainer's credit for a host is what it accepted: a forward and its backward of 6 rows
    each, signed by the trainer for the server's peer id, and a ledger reading it ranks the host."""
    _, server, client = world
    remote = RemoteExpert("ffn.0", server.addr, client, forward_timeout=5, backward_timeout=5, compression="none")
    done = threading.Event()

    def trainer() -> None:
        remote(torch.randn(6, 8, requires_grad=True)).sum().backward()
        done.set()

    thread = threading.Thread(target=trainer)
    thread.start()
    thread.join(15)
    assert done.is_set()
    [vouch] = client.loop.run(_due, client.vouches)
    assert vouch.host == server.host.peer_id.to_bytes() and vouch.trainer == client.keypair.peer_id.to_bytes()
    assert (vouch.calls, vouch.samples) == (2, 12)
    ledger = Ledger(SWARM)
    assert ledger.merge(vouch, time.time())
    assert ledger.contributors(time.time())[0]["peer"] == str(server.host.peer_id)


async def _due(book):  # the book is kept on the trio thread, as the calls that fill it run there
    return book.due(time.time())


def test_the_server_keeps_a_forward_graph_only_when_a_backward_will_follow(world):
    _, server, client = world
    cache = server.runtime.activations
    remote = RemoteExpert("ffn.0", server.addr, client)
    x = torch.randn(3, 8)
    with torch.no_grad():
        remote(x)  # inference: the request says no backward follows
    assert len(cache) == 0
    y = remote(x.clone().requires_grad_())  # training: the server keeps the graph (before replying)
    assert len(cache) == 1
    y.sum().backward()  # taken (before the reply): no forward recomputed
    assert (cache.hits, cache.misses) == (1, 0)
    assert server.runtime.backends["ffn.0"].updates == 1


def test_peer_forms_and_no_grad_forward(world):
    _, server, client = world
    x = torch.randn(3, 8)
    expected = None
    for peer in (server.addr, str(server.addr), str(server.host.peer_id), server.host.peer_id):
        # the PeerID forms find the address in the client's peerstore (the memory dial above)
        with torch.no_grad():
            y = RemoteExpert("ffn.1", peer, client)(x)
        expected = y if expected is None else expected
        assert torch.equal(y, expected)
    assert server.runtime.backends["ffn.1"].updates == 0  # no backward, no step


def test_killed_peer_is_unavailable(world):
    _, server, client = world
    remote = RemoteExpert("ffn.0", server.addr, client, forward_timeout=5)
    assert remote(torch.randn(2, 8)).shape == (2, 8)
    server.kill()
    started = time.monotonic()
    with pytest.raises(ExpertUnavailableError):
        remote(torch.randn(2, 8))
    assert time.monotonic() - started < 3


def test_silent_handler_times_out_quickly(world):
    loop, server, client = world

    async def silent(stream) -> None:
        await trio.sleep_forever()

    async def install() -> None:
        server.host.set_handler(protocol_id(SWARM), silent)

    loop.run(install)
    started = time.monotonic()
    with pytest.raises(ExpertTimeoutError, match="did not answer forward within 0.3 s"):
        RemoteExpert("ffn.0", server.addr, client, forward_timeout=0.3)(torch.randn(1, 8))
    assert time.monotonic() - started < 2
    # backward has its own timeout: the real server answers forward, then its worker is held
    loop.run(_set, server.host, protocol_id(SWARM), server.server.handle)
    x = torch.randn(1, 8, requires_grad=True)
    y = RemoteExpert("ffn.0", server.addr, client, forward_timeout=5, backward_timeout=0.3)(x)
    release = threading.Event()
    loop.run(_hold_worker, server.runtime, release)
    started = time.monotonic()
    try:
        with pytest.raises(ExpertTimeoutError, match="backward within 0.3 s"):
            y.sum().backward()
        assert time.monotonic() - started < 2
    finally:
        release.set()


async def _hold_worker(runtime, release: threading.Event) -> None:
    async def hold() -> None:
        await runtime.run_sync(release.wait, 10)

    trio.lowlevel.spawn_system_task(hold)
    await trio.sleep(0.05)


async def _set(host, protocol, handler) -> None:
    host.set_handler(protocol, handler)


def test_background_loop_runs_coroutines_for_ordinary_threads():
    async def add(a, b):
        await trio.sleep(0)
        return a + b

    async def fail():
        raise KeyError("as raised")

    with BackgroundLoop() as loop:
        assert loop.running
        assert loop.run(add, 2, 3) == 5
        with pytest.raises(KeyError, match="as raised"):
            loop.run(fail)
        started = time.monotonic()
        with pytest.raises(ExpertTimeoutError):
            loop.run(trio.sleep, 10, timeout=0.1)
        assert time.monotonic() - started < 2
        answers = []
        threads = [threading.Thread(target=lambda i=i: answers.append(loop.run(add, i, 1))) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert sorted(answers) == list(range(1, 9))
    assert not loop.running
    with pytest.raises(VolunteerError, match="not running"):
        loop.run(add, 1, 1)
    loop.stop()  # idempotent


def test_auto_sends_exact_tensors_to_this_machine_however_slow_it_looks(world):
    """A loaded machine once pushed a loopback round trip past 1 ms and auto went float16; the
    path (this process, loopback, a LAN) decides before any measurement."""
    _, server, client = world
    remote = RemoteExpert("ffn.1", server.addr, client)
    x = torch.randn(3, 8)
    remote(x)  # connected, measured once
    # what a loaded machine reports: slow round trips, a link whose bytes cost more than a round trip
    client.calls.rtt = lambda peer: 0.05
    client.calls.bytes_cost = lambda peer: 3.0
    client.calls.wire_seconds = lambda peer: 1.0
    with torch.no_grad():
        y = remote(x)
    assert torch.equal(y, server.runtime.backends["ffn.1"].forward([x])[0])
