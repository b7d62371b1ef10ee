"""The ``volunteer`` command: one entry point, one sub-command per job.

Each sub-command lives in its own module and registers itself through ``add_parser``; errors a
user can cause (bad flags, unreachable peers, unsafe key files) end in one clear line and a
non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..errors import VolunteerError, describe
from . import doctor, expertscmd, joincmd, netcmds, perfcmd, relaycmd, testnet

EXAMPLES = """\
examples:
  volunteer join demo --experts ffn:expert.[0:4].[0:8]   donate this machine: host 32 experts
  volunteer status                              the running daemon's dashboard (--json for scripts)
  volunteer pause / volunteer resume            stop / restart taking expert requests
  volunteer experts demo                        which experts are alive, and where
  volunteer testnet -n 4                        a whole local swarm to try things out
  volunteer id                                  print this machine's peer ID (created on first use)
  volunteer ping /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...   ping any libp2p peer
  volunteer perf --download 64MiB /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...   measure a link
  volunteer relay --listen /ip4/0.0.0.0/tcp/4001 --metrics 127.0.0.1:9100      run a public relay
  volunteer doctor /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...                   check connectivity
"""

COMMAND_MODULES = [joincmd, expertscmd, testnet, netcmds, perfcmd, relaycmd, doctor]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="volunteer",
        description="Donate GPUs to train mixture-of-experts models, over libp2p, through NATs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    level = logging.WARNING - 10 * args.verbose
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except VolunteerError as exc:
        print(f"volunteer {args.command}: {describe_error(exc)}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        # trio nurseries wrap errors in groups; a user error inside one still deserves one line.
        leaves = list(_leaves(group))
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            return 130
        user_errors = [leaf for leaf in leaves if isinstance(leaf, VolunteerError)]
        if user_errors and len(user_errors) == len(leaves):
            print(f"volunteer {args.command}: {describe_error(user_errors[0])}", file=sys.stderr)
            return 1
        raise


def _leaves(group: BaseExceptionGroup):
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def describe_error(exc: BaseException) -> str:
    """One line for the user: our errors carry readable messages already."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else describe(exc)


if __name__ == "__main__":
    sys.exit(main())
