"""The ``volunteer`` command: one entry point, one sub-command per job.

Each sub-command lives in its own module and registers itself through ``add_parser``; errors a
user can cause (bad flags, unreachable peers, unsafe key files) end in one clear line and a
non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from .. import __version__
from ..errors import VolunteerError, describe

BROKEN_PIPE_EXIT = 141  # what a shell reports for a program ended by SIGPIPE: `volunteer status | head -1`

EXAMPLES = """\
examples:
  volunteer join ./demo.toml --experts 'ffn:expert.[0:4].[0:8]' donate: join the swarm whose file you were given
  volunteer join demo --web 127.0.0.1:7396      the same, with a local web page (live state, plots, buttons)
  volunteer status                              the running daemon's dashboard (--json for scripts)
  volunteer fold / pause / finish               serve / stop serving / finish what runs, then idle
  volunteer history                             what this machine gave, by day and by month
  volunteer experts demo                        which experts are alive, and where
  volunteer testnet -n 4                        a whole local swarm to try things out
  volunteer id                                  print this machine's peer ID (created on first use)
  volunteer ping /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...   ping any libp2p peer
  volunteer perf --download 64MiB /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...   measure a link
  volunteer relay --listen /ip4/0.0.0.0/tcp/4001 --metrics 127.0.0.1:9100      run a public relay
  volunteer doctor /ip4/203.0.113.7/tcp/4001/p2p/12D3KooW...                   check connectivity
  volunteer trainer-cert 12D3KooW... --swarm demo > trainer.cert              admit a trainer (organisers)
"""

# Which module registers each command, in the order ``--help`` lists them. Only that module is
# imported to run a command: importing all of them costs a `volunteer perf` or `volunteer ping`
# more start-up time than its transfer (the DHT, the node, the dashboard);
# tests/unit/test_cli_lazy.py checks this table against what the modules register.
COMMAND_MODULE = {
    "join": "joincmd", "status": "joincmd", "fold": "joincmd", "pause": "joincmd", "resume": "joincmd",
    "finish": "joincmd", "stop": "joincmd", "history": "historycmd", "experts": "expertscmd", "testnet": "testnet", "id": "netcmds", "ping": "netcmds", "perf": "perfcmd",
    "relay": "relaycmd", "doctor": "doctor", "trainer-cert": "trainercmd",
}
COMMAND_MODULES = list(dict.fromkeys(COMMAND_MODULE.values()))  # each once, in that order


def command_named(argv: list[str]) -> str | None:
    """The sub-command ``argv`` runs (its first word that is not a flag), if it is one we know."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMAND_MODULE else None
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``volunteer`` parser; ``-v`` is accepted before or after the command.

    With ``command``, only the module that defines it is imported and registered (what running
    one command needs); without, every sub-command is (help, a typo, tests).
    """
    parser = argparse.ArgumentParser(
        prog="volunteer",
        description="Donate GPUs to train mixture-of-experts models, over libp2p, through NATs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"volunteer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = [COMMAND_MODULE[command]] if command in COMMAND_MODULE else COMMAND_MODULES
    for name in names:
        importlib.import_module(f"{__package__}.{name}").add_parsers(sub)
    for subparser in sub.choices.values():
        # a separate dest: the sub-command's parse must not reset a count given before the command
        subparser.add_argument("-v", "--verbose", dest="sub_verbose", action="count", default=0,
                               help="more log output (-vv for debug)")
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse like ``parse_args``, but a flag the sub-command does not know is reported with that
    sub-command's own usage (argparse would show the top-level one); exits 2 either way."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        owner = subparsers.choices.get(args.command) if args.command else None
        (owner or parser).error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run one ``volunteer`` command; the exit status: 0 done, 1 a failure (one line on stderr
    saying what to do), 2 a usage error, 130 interrupted."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at interpreter exit: a closed pipe is then ours to silence
        return code
    except BrokenPipeError:
        return _silence_broken_pipe()


def _main(argv: list[str] | None) -> int:
    parser = build_parser(command_named(sys.argv[1:] if argv is None else argv))
    args = parse(parser, argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    verbosity = args.verbose + getattr(args, "sub_verbose", 0)
    level = logging.WARNING - 10 * verbosity
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .logburst import install

    install()  # an expert failing every call is one warning per burst, not one per call
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
        if any(isinstance(leaf, BrokenPipeError) for leaf in leaves):
            return _silence_broken_pipe()
        user_errors = [leaf for leaf in leaves if isinstance(leaf, VolunteerError)]
        if user_errors and len(user_errors) == len(leaves):
            print(f"volunteer {args.command}: {describe_error(user_errors[0])}", file=sys.stderr)
            return 1
        raise


def _silence_broken_pipe() -> int:
    """The reader went away (``| head -1``): not an error worth a word. Point stdout at devnull
    so the interpreter's final flush does not complain either (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return BROKEN_PIPE_EXIT


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
