"""Our HivemindDHT against a real hivemind 1.1.12 DHT (its own venv, its own p2pd), on loopback.

Store in one implementation and get in the other, both ways, with dictionary values and
expirations; hivemind's bootstrap ping (validate=True) is answered by pinging it back; an RSA
(``identity_path``, ``Qm…``) hivemind peer is met end to end. Skipped when the hivemind venv is
absent, unless VOLUNTEER_REQUIRE_INTEROP=1 (then it fails).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from volunteer.hivemind import DictionaryValue, HivemindDHT, key_id
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.identity import PeerID
from volunteer.net.multiaddr import Multiaddr

pytestmark = pytest.mark.interop

ROOT = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).parent / "peers" / "hivemind_peer.py"
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


def hivemind_python() -> Path:
    """hivemind's venv python, or skip (fail under VOLUNTEER_REQUIRE_INTEROP=1)."""
    venv = Path(os.environ.get("VOLUNTEER_HIVEMIND_VENV", ROOT / ".bench" / "hm"))
    python = venv / "bin" / "python"
    if not python.exists():
        message = f"hivemind 1.1.12 is not installed at {venv}: run bash benchmarks/setup_hivemind.sh"
        if os.environ.get("VOLUNTEER_REQUIRE_INTEROP") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


class HivemindPeer:
    """A hivemind DHT in a subprocess (its own process group, killed whatever happens)."""

    def __init__(self, process: trio.Process, log: Path) -> None:
        self.process = process
        self.log = log
        self._buffer = b""
        self.addr = ""

    async def readline(self, timeout: float = 60) -> str:
        with trio.fail_after(timeout):
            while b"\n" not in self._buffer:
                data = await self.process.stdout.receive_some(65536)
                if not data:
                    raise RuntimeError(f"hivemind peer exited: {self.log.read_text()[-3000:]}")
                self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    async def command(self, timeout: float = 60, **command) -> dict:
        await self.process.stdin.send_all(json.dumps(command).encode() + b"\n")
        while True:
            line = await self.readline(timeout)
            if line.startswith("{"):
                return json.loads(line)

    @property
    def peer_id(self) -> PeerID:
        return PeerID.from_string(self.addr.rsplit("/p2p/", 1)[1])


@asynccontextmanager
async def hivemind_peer(*args: str):
    python = hivemind_python()
    with tempfile.TemporaryDirectory(prefix="hm-peer-") as tmp:
        log = Path(tmp) / "stderr.log"
        with open(log, "wb") as err:
            process = await trio.lowlevel.open_process(
                [str(python), str(PEER_SCRIPT), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, start_new_session=True, cwd=tmp,
            )
        peer = HivemindPeer(process, log)
        try:
            while True:
                line = await peer.readline(90)
                if line.startswith("READY "):
                    peer.addr = line.split()[1]
                    break
            yield peer
        finally:
            # p2pd and hivemind's DHT process are children in the same group
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            with trio.CancelScope(shield=True):
                await process.wait()


@asynccontextmanager
async def our_node():
    dht = HivemindDHT()
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET, services=[dht]) as host:
        yield host, dht


async def wait_for(predicate, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)


@pytest.mark.trio_timeout(180)
async def test_store_and_get_both_ways_with_a_real_hivemind_dht():
    async with our_node() as (host, dht):
        async with hivemind_peer(str(host.full_addrs()[0])) as hm:
            # hivemind's bootstrap pinged us with validate=True: we pinged back and keep it as a contact
            await wait_for(lambda: hm.peer_id in dht.core.contacts)
            now = time.time()

            # hivemind → us: it stores on its nearest nodes, which include us
            assert (await hm.command(op="store", key="from_hivemind", value=["x", 1], expiration=now + 60))["ok"]
            await wait_for(lambda: dht.core.storage.get(key_id("from_hivemind"), time.time()) is not None)
            (answer,) = await dht.find_at(hm.peer_id, [key_id("from_hivemind")])
            assert answer.value is not None and answer.value.expiration_time == now + 60
            found = await dht.get("from_hivemind")
            assert found.value == ["x", 1] and found.expiration_time == now + 60

            # us → hivemind, and the later expiration wins on its side too
            assert await dht.store("from_us", "first", now + 30)
            assert await dht.store("from_us", "second", now + 50)
            reply = await hm.command(op="get", key="from_us")
            assert reply["found"] == {"value": "second", "expiration": now + 50}
            assert not await dht.store("from_us", "older", now + 40) or (
                (await hm.command(op="get", key="from_us"))["found"]["value"] == "second"
            )

            # dictionary values: one sub-key from each side, both seen by both
            assert (await hm.command(op="store", key="grid", value="a", expiration=now + 40, subkey="s1"))["ok"]
            assert await dht.store("grid", "b", now + 45, subkey="s2")
            reply = await hm.command(op="get", key="grid")
            items = {subkey: (value, exp) for subkey, value, exp in reply["found"]["dictionary"]}
            assert items == {"s1": ("a", now + 40), "s2": ("b", now + 45)}
            found = await dht.get("grid")
            assert isinstance(found.value, DictionaryValue)
            assert {k: v.value for k, v in found.value.items.items()} == {"s1": "a", "s2": "b"}

            # a key nobody stored
            assert (await hm.command(op="get", key="nothing"))["found"] is None
            assert await dht.get("nothing") is None


@pytest.mark.trio_timeout(180)
async def test_we_join_a_hivemind_dht_with_an_rsa_identity():
    with tempfile.TemporaryDirectory(prefix="hm-rsa-") as tmp:
        identity = str(Path(tmp) / "identity.key")
        async with hivemind_peer("--identity", identity) as hm:
            assert str(hm.peer_id).startswith("Qm")  # RSA-2048 keys hash to sha2-256 peer ids
            async with our_node() as (host, dht):
                assert await dht.bootstrap([Multiaddr(hm.addr)]) == 1
                assert host.connection_to(hm.peer_id) is not None
                now = time.time()
                assert await dht.store("rsa-key", 7, now + 30)
                assert (await hm.command(op="get", key="rsa-key"))["found"] == {"value": 7, "expiration": now + 30}
