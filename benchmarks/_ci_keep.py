"""Instructions one remote expert call executes, trainer and volunteer side, counted by callgrind.

    .venv/bin/python benchmarks/call_instructions.py [--calls 50] [--case "h256 forward"] [--receipts on|off]

Needs valgrind (``apt-get install valgrind``). Both processes run under callgrind with its
instrumentation off while they start (importing torch under it would take many minutes) and on
only around ``--calls`` calls (after a warm-up); it prints the instructions per call of each side,
split by the library they ran in: the Python interpreter (our code, trio's, msgpack's Python
parts), torch's compute kernels, the rest of torch (dispatch), the crypto libraries (Noise's
ChaCha20-Poly1305, Ed25519 receipts, sha256 digests), libc.

Why: on a shared machine a wall-clock or CPU-time A/B of a change worth a few percent drowns in
the load (paired runs of one tree disagreed by 40 %); an instruction count does not move with
the load. It is no wall time: callgrind emulates an AVX2 machine without the SHA and ADX
instructions, so the crypto counts are several times what the real CPU runs (sha256 with SHA-NI,
Ed25519 with ADX), while the interpreter's and torch's are what they are. Compare two trees by
running this in each, at similar loads: what the processes do in the background meanwhile
(keepalives, timers: callgrind makes the counted calls take minutes of wall time) counts too, and
a loaded machine runs more of it per call. Wall times stay ``benchmarks/experts.py``'s.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {"h256 forward": (256, 16, False), "h256 fwd+bwd": (256, 16, True),
         "h1024 forward": (1024, 64, False), "h1024 fwd+bwd": (1024, 64, True)}
WARM_UP = 20  # calls before counting, uninstrumented and then instrumented (caches, kept graphs)


def callgrind(out: str) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]


def control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def by_library(path: str) -> collections.Counter:
    """Instructions of a callgrind dump by library (torch's kernels apart from its dispatch)."""
    listing = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
                             capture_output=True, text=True, check=True).stdout
    found: collections.Counter = collections.Counter()
    for line in listing.splitlines():
        match = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)\[(.*)\]\s*$", line)
        if not match:
            continue
        count, function, library = int(match.group(1).replace(",", "")), match.group(2), match.group(3)
        name = library.rsplit("/", 1)[-1]
        if name.startswith("libpython"):
            name = "python interpreter"
        elif "libtorch_cpu" in name:
            kernel = re.search(r"gemm|Sleef|gelu|norm|Vectorized|vectorized|at::native", function)
            name = "torch kernels" if kernel else "torch (dispatch and the rest)"
        elif name.startswith(("libcrypto", "_rust.abi3")):
            name = "crypto (OpenSSL, cryptography)"
        elif name.startswith("libc.so"):
            name = "libc"
        else:
            name = re.sub(r"\.cpython-[^.]*\.so$|\.so[.\d]*$", "", name)
        found[name] += count
    return found


def dump(prefix: str) -> str:
    """The dump ``callgrind_control -d`` wrote (part 1), waiting a moment for it."""
    for _ in range(100):
        found = glob.glob(prefix + ".*.1") or glob.glob(prefix + ".1")
        if found:
            return found[0]
        time.sleep(0.1)
    raise SystemExit(f"no callgrind dump at {prefix}")


def trainer(args: argparse.Namespace) -> None:
    """Runs under callgrind: starts the volunteer under callgrind too, calls, counts, prints."""
    os.environ["OMP_NUM_THREADS"] = "1"
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch

    torch.set_num_threads(1)
    from _measure import forward, forward_backward
    from experts import Client
    from volunteer import RemoteExpert

    hidden, batch, backward = CASES[args.case]
    server = subprocess.Popen([*callgrind(f"{args.out}/volunteer.%p"), sys.executable,
                               str(ROOT / "benchmarks" / "_expert_server.py"), "--receipts", args.receipts],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = server.stdout.readline()
    assert line.startswith("READY "), line
    client = Client()
    try:
        expert, x = RemoteExpert(f"ffn{hidden}.0", line.split()[1], client), torch.randn(batch, hidden)
        call = forward_backward if backward else forward
        for _ in range(WARM_UP):
            call(expert, x)
        for pid in (server.pid, os.getpid()):
            control(pid, "-i", "on")
        for _ in range(WARM_UP):
            call(expert, x)
        for pid in (server.pid, os.getpid()):
            control(pid, "-z")
        for _ in range(args.calls):
            call(expert, x)
        for pid in (server.pid, os.getpid()):
            control(pid, "-d")
    finally:
        client.close()
        server.stdin.close()
        server.wait(timeout=300)
    print(f"Instructions per remote call, {args.case} (ffn h{hidden} b{batch}), receipts {args.receipts}, "
          f"{args.calls} calls counted by callgrind")
    for side, prefix in (("TRAINER", f"{args.out}/trainer.{os.getpid()}"), ("VOLUNTEER", f"{args.out}/volunteer.{server.pid}")):
        counts = by_library(dump(prefix))
        print(f"{side}: {sum(counts.values()) / args.calls / 1000:.0f} k instructions per call")
        for name, count in counts.most_common(8):
            print(f"  {name:<36}{count / args.calls / 1000:>10.0f} k")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--case", default="h256 forward", choices=sorted(CASES))
    parser.add_argument("--receipts", default="on", choices=["on", "off"])
    parser.add_argument("--out", help=argparse.SUPPRESS)  # the trainer process: where the dumps go
    args = parser.parse_args()
    if args.out:
        trainer(args)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("call_instructions needs valgrind (apt-get install valgrind)")
    out = "/tmp/prof/cg"; os.makedirs(out, exist_ok=True)
    if True:
        command = [*callgrind(f"{out}/trainer.%p"), sys.executable, __file__, "--out", out, "--calls", str(args.calls),
                   "--case", args.case, "--receipts", args.receipts]
        subprocess.run(command, check=True, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
