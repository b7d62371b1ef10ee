"""Hostile peers against a DHT node on loopback (key squatting, per-address store floods).

The node under attack (127.0.0.1) is the only server of a small swarm: an honest volunteer on
127.0.0.3 declares its experts there, a trainer lists the grid from it, and an attacker on
127.0.0.2 (several hosts, each built from the project's own Host and DHT driver, sending records
signed by a thousand identities) squats the grid's prefix key and floods the storage. The trainer
must keep seeing the honest experts during and after the attack, and the node's storage must stay
within its configured bounds (measured by walking what it holds).
"""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import pytest
import trio

from volunteer.dht import DHTConfig
from volunteer.dht.declare import ExpertDeclarer
from volunteer.dht.grid import Declaration, grid_experts
from volunteer.dht.node import open_dht
from volunteer.dht.records import owned_subkey, sign
from volunteer.dht.routing import Contact
from volunteer.errors import DHTError, VolunteerError
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.identity import KeyPair

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
# small bounds, so the attack reaches every one of them in a few rounds
NODE = DHTConfig(
    swarm_id="hostile",
    max_subkeys_per_key=256,
    max_total_records=2048,
    max_total_bytes=1024 * 1024,
    expert_update_period=1.0,
    expert_expiration=10.0,
)
PEER = DHTConfig(swarm_id="hostile", expert_update_period=1.0, expert_expiration=10.0)
HONEST_UIDS = ["ffn.0.0", "ffn.1.1"]
SYBILS = 1024
ROUNDS = 4


async def attack_round(attackers, target: Contact, squatter: KeyPair, sybils: list[KeyPair], round_: int) -> None:
    """One round: the squatter's 1,024 far-future sub-keys, every sybil's fake declaration under
    the grid's prefix key, and a storage flood of distinct keys; spread over the attacker hosts."""
    far = time.time() + 3000 + round_  # newer each round, so nothing is merely "stale"
    squat = [sign(squatter, b"ffn.", owned_subkey(squatter.peer_id, i.to_bytes(2, "big")), b"x", far) for i in range(1024)]
    fakes = []
    for kp in sybils:
        decl = Declaration(kp.peer_id, (b"/ip4/127.0.0.2/tcp/9",), 0.0, time.time(), ((9, "ffn.9.9"),))
        fakes.append(sign(kp, b"ffn.", owned_subkey(kp.peer_id), decl.encode(), far))
    flood = [sign(kp, b"junk/%d/%d" % (round_, i), owned_subkey(kp.peer_id), b"j" * 256, far) for i, kp in enumerate(sybils)]
    await send(attackers[0], target, squat)
    async with trio.open_nursery() as nursery:  # then every identity at once, from every host
        for i, records in enumerate([fakes[: SYBILS // 2], fakes[SYBILS // 2 :], flood]):
            nursery.start_soon(send, attackers[i % len(attackers)], target, records)


async def send(attacker, target: Contact, records) -> None:
    try:
        await attacker.request(target, attacker.state.store_request(records))
    except (DHTError, VolunteerError):
        pass  # refused (rate-limited): the attacker does not care, and the node counted it


async def listed(trainer) -> dict:
    return await grid_experts(trainer, "ffn", 2)


def measured(node) -> tuple[int, int, int]:
    """(records, bytes, sub-keys of the grid's prefix key) actually held, by walking the storage."""
    records = list(node.state.storage.records(time.time() - 1))  # include any not yet collected
    prefix = sum(1 for r in records if r.key == b"ffn.")
    return len(records), sum(r.size for r in records), prefix


@pytest.mark.slow
@pytest.mark.trio_timeout(120)
async def test_squatting_and_store_floods_do_not_hide_honest_experts():
    squatter = KeyPair.generate()
    sybils = [KeyPair.generate() for _ in range(SYBILS)]
    async with AsyncExitStack() as stack:
        host = await stack.enter_async_context(open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET))
        node = await stack.enter_async_context(open_dht(host, NODE))
        boot = [host.full_addrs()[0]]
        target = Contact(host.peer_id)

        honest_host = await stack.enter_async_context(open_stack(listen=["/ip4/127.0.0.3/tcp/0"], options=QUIET))
        honest = await stack.enter_async_context(open_dht(honest_host, PEER, bootstrap=boot, client_mode=True))
        declarer = ExpertDeclarer(honest, HONEST_UIDS)
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(declarer.run, declarer.host)

        trainer_host = await stack.enter_async_context(open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET))
        trainer = await stack.enter_async_context(open_dht(trainer_host, PEER, bootstrap=boot, client_mode=True))
        with trio.fail_after(30):
            while not set(HONEST_UIDS) <= set(await listed(trainer)):
                await trio.sleep(0.1)

        attackers = []
        for _ in range(3):  # several identities on one address, each its own Host and driver
            attacker_host = await stack.enter_async_context(open_stack(listen=["/ip4/127.0.0.2/tcp/0"], options=QUIET))
            attackers.append(await stack.enter_async_context(open_dht(attacker_host, PEER, bootstrap=boot, client_mode=True)))

        for round_ in range(ROUNDS):
            await attack_round(attackers, target, squatter, sybils, round_)
            during = await listed(trainer)
            assert set(HONEST_UIDS) <= set(during), f"round {round_}: {sorted(during)}"
            records, size, prefix = measured(node)
            assert records <= NODE.max_total_records and size <= NODE.max_total_bytes
            assert prefix <= NODE.max_subkeys_per_key
            assert len(node.state.storage) == records and node.state.storage.bytes_used == size

        rejected = node.snapshot()["rejected"]
        assert rejected.get("signer-share", 0) >= 1024 - NODE.max_subkeys_per_signer_per_key
        assert node.state.storage.evicted > 0  # the attacker's records made room, not the honest ones
        holders = node.state.storage.holders(b"ffn.")[0]
        assert holders[squatter.peer_id] <= NODE.max_subkeys_per_signer_per_key

        # after the attack: heartbeats go on being accepted and listed
        declared = declarer.declarations
        with trio.fail_after(30):
            while declarer.declarations < declared + 2:
                await trio.sleep(0.1)
        after = await listed(trainer)
        assert set(HONEST_UIDS) <= set(after)
        assert all(after[uid][0].peer == honest_host.peer_id for uid in HONEST_UIDS)
        nursery.cancel_scope.cancel()
