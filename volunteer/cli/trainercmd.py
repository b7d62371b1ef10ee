"""``volunteer trainer-cert``: an organiser admits trainers to its swarm.

``--init`` makes the organiser's key (kept like a peer's identity, mode 0600) and prints the
``organiser = "..."`` line for the swarm file; with a trainer's peer ID it prints a certificate
that admits that trainer until it expires. A trainer presents it with
``Swarm.join(..., keypair=<its key>, trainer_cert=FILE)`` (``examples/train_digits.py
--trainer-cert FILE``); volunteers then apply its gradients."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..errors import VolunteerError

EXAMPLES = """\
examples:
  volunteer trainer-cert --init                          make the organiser key; prints the swarm file's organiser line
  volunteer trainer-cert 12D3KooW... --swarm demo --days 30 > trainer.cert
                                                         admit that trainer to swarm demo for 30 days
"""
DEFAULT_DAYS = 30


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``volunteer trainer-cert``."""
    p = sub.add_parser("trainer-cert", help="admit a trainer to your swarm (organisers): print a signed certificate",
                       description="Issue a certificate, signed with the organiser's key, that admits one trainer "
                       "(by peer ID) to a swarm until it expires. A swarm file whose organiser line names the key "
                       "makes its volunteers apply gradients only from admitted trainers.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trainer", nargs="?", metavar="PEER-ID", help="the trainer's peer ID (`volunteer id` on its machine)")
    p.add_argument("--swarm", metavar="ID", help="the swarm id the certificate admits to (the swarm file's id)")
    p.add_argument("--days", type=float, default=DEFAULT_DAYS, help=f"valid for this many days (default {DEFAULT_DAYS})")
    p.add_argument("--key", type=Path, metavar="FILE",
                   help="the organiser's key file (default: organiser.key in the config directory)")
    p.add_argument("--init", action="store_true", help="create the organiser key if needed and print the swarm file line")
    p.set_defaults(run=run_trainer_cert)


def run_trainer_cert(args: argparse.Namespace) -> int:
    """Print the organiser line (``--init``) or a certificate for ``args.trainer``."""
    from ..experts.trainers import MAX_CERT_DAYS, TrainerCertificate, public_key_text
    from ..net.identity import PeerID, load_keypair, load_or_create_keypair
    from ..paths import config_dir
    from ..swarmfile import check_swarm_id

    path = args.key or config_dir() / "organiser.key"
    if args.init:
        keypair, created = load_or_create_keypair(path)
        print(f"# {'created' if created else 'using'} the organiser key {path}; put this line in the swarm file:")
        print(f'organiser = "{public_key_text(keypair.public_key)}"')
        return 0
    if not args.trainer or not args.swarm:
        raise VolunteerError("give the trainer's peer ID and --swarm ID (or --init to make the organiser key)")
    if not 0 < args.days <= MAX_CERT_DAYS:
        raise VolunteerError(f"--days must be above 0 and at most {MAX_CERT_DAYS}")
    trainer, swarm_id = PeerID.from_string(args.trainer), check_swarm_id(args.swarm)  # what was typed first
    if not path.exists():
        raise VolunteerError(f"no organiser key at {path}: run `volunteer trainer-cert --init` first (or give --key)")
    keypair = load_keypair(path)
    cert = TrainerCertificate.issue(keypair, swarm_id, trainer, time.time() + args.days * 86400)
    print(cert.to_text())
    return 0
