"""A real hivemind 1.1 DHT peer for interop tests; runs in hivemind's own venv (.bench/hm).

    python hivemind_peer.py [--identity PATH] [--client] [INITIAL_PEER ...]

Prints ``READY <full multiaddr>`` once up, then answers one JSON command per stdin line with one
JSON line: {"op": "store", "key", "value", "expiration", ["subkey"]}, {"op": "get", "key"},
{"op": "peer_id"}, {"op": "ping", "peer_id"} (a DHT ping of a peer named by id only: p2pd finds
its addresses through libp2p's kad peer routing; answers {"node_id": hex or null}). Values are JSON (lists for tuples); a dictionary value comes back as
{"dictionary": [[subkey, value, expiration], ...], "expiration": ...}. Exits when stdin closes.
"""

import argparse
import functools
import json
import sys

import hivemind
from hivemind.p2p import PeerID
from hivemind.dht.storage import DictionaryDHTValue


def encode(found):
    if found is None:
        return None
    value, expiration = found.value, found.expiration_time
    # DHT.get returns a dictionary value as {subkey: ValueWithExpiration(value, expiration)}
    if isinstance(value, (dict, DictionaryDHTValue)):
        items = []
        for subkey, item in value.items():
            inner = item.value
            # DHT.get wraps each decoded sub-value in a ValueWithExpiration of its own
            while hasattr(inner, "expiration_time"):
                inner = inner.value
            items.append([subkey, inner, item.expiration_time])
        return {"dictionary": items, "expiration": expiration}
    return {"value": value, "expiration": expiration}


async def ping(_dht, node, peer_id: str):
    """Runs in hivemind's DHT process: a DHTProtocol.rpc_ping to a peer given by id alone."""
    node_id = await node.protocol.call_ping(PeerID.from_base58(peer_id))
    return None if node_id is None else f"{int(node_id):040x}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--identity")
    parser.add_argument("--client", action="store_true")
    parser.add_argument("initial_peers", nargs="*")
    args = parser.parse_args()
    dht = hivemind.DHT(
        start=True,
        initial_peers=args.initial_peers or None,
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        identity_path=args.identity,
        client_mode=args.client,
    )
    addrs = [str(addr) for addr in dht.get_visible_maddrs() if "/tcp/" in str(addr)]
    print("READY", addrs[0] if addrs else f"/p2p/{dht.peer_id}", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "store":
            kwargs = {"subkey": command["subkey"]} if "subkey" in command else {}
            reply = {"ok": dht.store(command["key"], command["value"], command["expiration"], **kwargs)}
        elif op == "get":
            reply = {"found": encode(dht.get(command["key"], latest=True))}
        elif op == "ping":
            reply = {"node_id": dht.run_coroutine(functools.partial(ping, peer_id=command["peer_id"]))}
        elif op == "peer_id":
            reply = {"peer_id": str(dht.peer_id)}
        else:
            reply = {"error": f"unknown op {op}"}
        print(json.dumps(reply), flush=True)
    dht.shutdown()


if __name__ == "__main__":
    main()
