"""What exact audits cost: receipt bytes per call, the host's snapshot per state version, the
auditor's recompute, and the audit's share of a trainer's step.

    .venv/bin/python benchmarks/exact_audits.py [--repeats 50] [--torch-threads 1]

(``benchmarks/audits.py`` runs the digits example with liars and measures what audits cost a
whole training step, audits switched on and off in the same run; this one takes the pieces apart.)

For ffn experts (hidden 64 / batch 32: the digits run's; 256 / 16; 1024 / 64), in this process:
- receipt bytes on the wire per reply (the signed receipt in the reply header);
- the per-call work receipts add: on the host, a digest of the inputs and of the reply and one
  Ed25519 signature; on the trainer, a digest of what arrived (signatures are verified only where
  a receipt is evidence, in an audit);
- per state version (once per optimizer step while an expert trains, never per call): the copy
  of its module tensors, into an evicted snapshot's memory once the window is full (steady) and
  into fresh memory before (first), and the memory one snapshot holds;
- per snapshot served (an audit's fetch, a few in a hundred versions): the host's digest of it,
  for the binding it signs (a third party checking a proof hashes it too; an auditor does not);
- per audit: verifying the receipt and recomputing the forward (and the backward of its input
  gradients);
- the audit's share of a trainer's step at the trusted rate (2 %) and the untrusted one (20 %):
  (recompute + the snapshot's transfer) x rate / (one remote forward+backward). On loopback the
  transfer is a memory copy of the snapshot (a lower bound) and the call ``--remote-overhead-ms``
  over the local compute; on the WAN rig's cable profile (20 ms one way, 10 Mbit/s up) the host
  uploads the snapshot in one round trip and the call takes two round trips and its tensors;
- the trusted floor the audits' cost budget leaves (``AuditConfig.cost_share``, 5 % of the
  trainer's time): 2 % where audits are cheap, thinner where one snapshot costs more than the
  calls it checks (the cable profile's large experts).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from volunteer.experts.backend import make_backend  # noqa: E402
from volunteer.experts.comparison import AuditConfig  # noqa: E402
from volunteer.experts.receipts import FORWARD, BACKWARD, Receipt, payload_digest, tensor_digest  # noqa: E402
from volunteer.experts.recompute import Recomputer  # noqa: E402
from volunteer.experts.snapshots import SnapshotPolicy, SnapshotStore, state_digest  # noqa: E402
from volunteer.experts.tensors import serialize  # noqa: E402
from volunteer.net.identity import KeyPair  # noqa: E402

CONFIGS = ((64, 32), (256, 16), (1024, 64))


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def measure(hidden: int, batch: int, repeats: int) -> dict:
    keys = KeyPair.generate()
    backend = make_backend(f"ffn.{hidden}", "ffn", hidden)
    x, g = torch.randn(batch, hidden), torch.randn(batch, hidden)
    store = SnapshotStore()
    stamp = store.note(backend)
    outputs = backend.forward([x])
    header, chunks = serialize(outputs, "none")
    chunks = list(chunks)

    def receipt(op=FORWARD, inputs=(x,), reply=None) -> Receipt:
        reply_header, reply_chunks = (header, chunks) if reply is None else (lambda h, c: (h, list(c)))(*serialize(reply))
        return Receipt(keys.peer_id.to_bytes(), backend.uid, op, stamp.expert_class, stamp.hidden_dim, stamp.version,
                       stamp.state, tensor_digest(list(inputs)), payload_digest(reply_header, reply_chunks), batch,
                       "torch.float32", stamp.device, stamp.threads, "none").sign(keys)

    signed = receipt()
    host_ms = median_ms(receipt, repeats)
    trainer_ms = median_ms(lambda: payload_digest(header, chunks), repeats)

    def copy_ms(into: SnapshotStore, count: int, warm: int = 0) -> float:
        """Median ms of ``into.note`` after a step (the fingerprint changes: it copies)."""
        times = []
        for index in range(warm + count):
            with torch.no_grad():
                for p in backend.module.parameters():
                    p.add_(1e-6)  # a step, not timed
            started = time.perf_counter()
            into.note(backend)
            if index >= warm:
                times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e3

    version_ms = copy_ms(store, max(5, repeats // 5))  # the window not yet full: fresh memory
    full = SnapshotStore(SnapshotPolicy(max_count=2))  # a full window: each copy goes into evicted memory
    steady_ms = copy_ms(full, max(5, repeats // 5), warm=3)
    stamp = store.note(backend)
    snapshot = store.get(stamp.state)
    named = list(zip(snapshot.names, snapshot.tensors))
    digest_ms = median_ms(lambda: state_digest(named), max(5, repeats // 5))  # host when serving, auditor when fetched
    outputs = backend.forward([x])
    header, chunks = serialize(outputs, "none")
    chunks = list(chunks)
    signed = receipt()
    recomputer = Recomputer()
    forward_ms = median_ms(lambda: recomputer.check(signed, keys.peer_id, snapshot.names, snapshot.tensors, [x], outputs),
                           repeats)
    leaves = x.clone().requires_grad_(True)
    out = backend.module(leaves)
    out.backward(g)
    grad_inputs = [leaves.grad.detach()]
    back = receipt(BACKWARD, (x, g), grad_inputs)
    backward_ms = median_ms(lambda: recomputer.check(back, keys.peer_id, snapshot.names, snapshot.tensors, [x],
                                                     grad_inputs, grad_outputs=[g]), repeats)
    local_ms = median_ms(lambda: backend.backward([x], [g]), repeats)  # the host's work of one fwd+bwd call
    copy = torch.empty(snapshot.nbytes // 4)
    source = torch.randn(snapshot.nbytes // 4)
    loopback_ms = median_ms(lambda: copy.copy_(source), repeats)
    # cable: 20 ms one way, 10 Mbit/s up on both ends (the host uploads the snapshot, the trainer
    # its inputs and gradients); a call is two round trips (forward, backward) and four tensors
    rtt, up = 40.0, 10e6
    cable_ms = rtt + snapshot.nbytes * 8 / up * 1e3
    cable_call_ms = local_ms + 2 * rtt + 4 * x.nelement() * 4 * 8 / up * 1e3
    return {
        "receipt_bytes": len(signed.encode()), "host_us": host_ms * 1e3, "trainer_us": trainer_ms * 1e3,
        "snapshot_bytes": snapshot.nbytes, "version_ms": version_ms, "steady_ms": steady_ms, "digest_ms": digest_ms, "recompute_fwd_ms": forward_ms,
        "recompute_bwd_ms": backward_ms, "call_ms": local_ms, "loopback_ms": loopback_ms, "cable_ms": cable_ms,
        "cable_call_ms": cable_call_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--remote-overhead-ms", type=float, default=5.5,
                        help="what a remote fwd+bwd adds to the local one (benchmarks/experts.py, h256 b16)")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    print(f"Exact audits (ffn experts, CPU, {args.torch_threads} torch thread(s), median of {args.repeats})")
    head = (f"{'expert':<12}{'receipt B':>10}{'host us':>9}{'trainer us':>11}{'snapshot MB':>12}{'version ms':>11}"
            f"{'first':>7}{'served ms':>10}{'recompute ms':>13}{'share@2% lo':>12}{'cable':>8}{'share@20% lo':>13}{'cable':>8}")
    print(head)
    kept, floors = [], []
    budget = AuditConfig().cost_share
    for hidden, batch in CONFIGS:
        f = measure(hidden, batch, args.repeats)
        policy = SnapshotPolicy()
        kept.append(f"h{hidden} {min(policy.max_count, policy.max_bytes // f['snapshot_bytes'])}")
        recompute = f["recompute_fwd_ms"] + f["recompute_bwd_ms"]
        loopback_call = f["call_ms"] + args.remote_overhead_ms  # one remote forward+backward of this expert
        shares = [rate * (recompute + transfer) / call for rate in (0.02, 0.2)
                  for transfer, call in ((f["loopback_ms"], loopback_call), (f["cable_ms"], f["cable_call_ms"]))]
        floor = [min(0.02, budget * call / (recompute + transfer))
                 for transfer, call in ((f["loopback_ms"], loopback_call), (f["cable_ms"], f["cable_call_ms"]))]
        floors.append(f"h{hidden} {floor[0]:.2%} / {floor[1]:.2%}")
        print(f"{f'h{hidden} b{batch}':<12}{f['receipt_bytes']:>10}{f['host_us']:>9.0f}{f['trainer_us']:>11.0f}"
              f"{f['snapshot_bytes'] / 2**20:>12.2f}{f['steady_ms']:>11.2f}{f['version_ms']:>7.1f}{f['digest_ms']:>10.2f}"
              f"{recompute:>13.2f}"
              f"{shares[0]:>12.1%}{shares[1]:>8.1%}{shares[2]:>13.1%}{shares[3]:>8.1%}")
    print("(version: the host's copy of a new state into an evicted snapshot's memory, the steady state; first: into fresh"
          " memory, while the window fills; served: the host's digest, once per snapshot an auditor fetches)")
    print("(share: an audit's recompute and snapshot transfer, at that audit rate, over one remote fwd+bwd of the expert;"
          " an audit fetches a snapshot once per state version it checks)")
    print(f"the trusted floor under the audits' cost budget ({budget:.0%} of the trainer's time, AuditConfig.cost_share): "
          + ", ".join(floors) + " of a trusted host's calls audited (loopback / cable), so its share is at most "
          f"{budget:.0%}; fresh, unproven and suspect hosts are audited at their rates whatever it costs")
    print(f"snapshot memory: at most {SnapshotPolicy().max_bytes // 2**20} MiB per host (SnapshotPolicy), the newest of each"
          f" expert beyond it; versions of one expert that fit: {', '.join(kept)} (the window, at one version per step)")


if __name__ == "__main__":
    main()
