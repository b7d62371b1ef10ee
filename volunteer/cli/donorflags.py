"""``volunteer join``'s donor flags: consent, the run-when policies, GPU choice, self-care and
the local web page; each policy flag overrides the same key of config.toml's ``[run]`` table."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import VolunteerError
from ..web.serve import host_port_arg
from ..donor.policy import PolicyError, PolicySettings, settings_from
from ..donor.selfcare import DEFAULT_FAILURE_LIMIT


def _gpu_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU numbers like 0,2, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected GPU numbers like 0,2, got {text!r}")
    return values


def add_donor_flags(p: argparse.ArgumentParser) -> None:
    """Consent, run-when, GPU and web flags of ``join`` (config.toml ``[run]`` holds the same keys)."""
    g = p.add_argument_group("consent and the local web page")
    g.add_argument("--yes", action="store_true",
                   help="agree to donate with the settings shown, without asking, for this start (unattended installs; "
                   "[run] consent = true in config.toml says it for every start)")
    g.add_argument("--web", type=host_port_arg, metavar="HOST:PORT",
                   help="serve a local web page with live state, plots and fold/pause/finish buttons "
                   "(e.g. 127.0.0.1:7396; a per-install token guards it)")
    r = p.add_argument_group("run-when policies (config.toml [run] keys of the same names)")
    r.add_argument("--on-battery", choices=("pause", "run"), help="pause on battery (the default) or keep running")
    r.add_argument("--when-idle", type=float, metavar="MINUTES",
                   help="compute only after MINUTES without keyboard or mouse input (where the platform tells; "
                   "else with other programs' CPU load under --max-other-load, 25 %% by default), e.g. 3")
    r.add_argument("--max-other-load", type=float, metavar="PERCENT",
                   help="pause while other programs use more than PERCENT of the CPU, e.g. 25")
    r.add_argument("--pause-while", action="append", metavar="PROGRAM",
                   help="pause while PROGRAM runs (a process name, e.g. steam; repeatable)")
    r.add_argument("--pause-on-gpu-use", action="store_true", default=None,
                   help="pause while another program uses the GPU (where NVIDIA's driver tools tell; else shown as unavailable)")
    r.add_argument("--compute-hours", action="append", metavar="HH:MM-HH:MM",
                   help="compute only inside this daily window, local time (repeatable, e.g. 22:00-07:00)")
    r.add_argument("--network-hours", action="append", metavar="HH:MM-HH:MM",
                   help="use the network only inside this daily window (repeatable)")
    r.add_argument("--daily-transfer", metavar="SIZE",
                   help="pause until midnight once this many bytes went in and out today, e.g. 20GiB")
    r.add_argument("--gpus", type=_gpu_list, metavar="N,M", help="the CUDA GPUs to use, e.g. 0,1 (default: cuda:0 or --device)")
    r.add_argument("--exclude-gpus", type=_gpu_list, metavar="N,M", help="CUDA GPUs never to use, e.g. 1")
    r.add_argument("--failure-limit", type=int, metavar="K",
                   help=f"set an expert aside after K calls in a row failed (default {DEFAULT_FAILURE_LIMIT})")
    # tests sample the machine more often than every 5 s
    r.add_argument("--policy-period", type=float, metavar="S", help=argparse.SUPPRESS)


@dataclass(frozen=True)
class DonorChoices:
    """What the donor flags and ``[run]`` decided."""

    policy: PolicySettings
    consent: bool
    failure_limit: int
    gpus: list[int] | None
    exclude_gpus: list[int]


def donor_choices(args: argparse.Namespace, run: dict) -> DonorChoices:
    """Merge the flags over config.toml's ``[run]``; one-line VolunteerError for a bad value."""
    values = dict(run)
    if args.on_battery is not None:
        values["on_battery"] = args.on_battery == "pause"
    for flag, key in (("when_idle", "when_idle"), ("max_other_load", "max_other_load"), ("pause_while", "pause_programs"),
                      ("compute_hours", "compute_hours"), ("network_hours", "network_hours"),
                      ("daily_transfer", "daily_transfer"), ("pause_on_gpu_use", "pause_on_gpu_use")):
        value = getattr(args, flag, None)
        if value is not None:
            values[key] = value
    try:
        policy = settings_from(values)
    except PolicyError as exc:
        raise VolunteerError(str(exc)) from None
    limit = args.failure_limit if args.failure_limit is not None else values.get("failure_limit", DEFAULT_FAILURE_LIMIT)
    if not isinstance(limit, int) or limit < 1:
        raise VolunteerError("--failure-limit (failure_limit) must be 1 or more")
    gpus = args.gpus if args.gpus is not None else values.get("gpus")
    exclude = args.exclude_gpus if args.exclude_gpus is not None else values.get("exclude_gpus", [])
    for name, value in (("gpus", gpus), ("exclude_gpus", exclude)):
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value)):
            raise VolunteerError(f"{name} must be a list of GPU numbers, e.g. [0, 1]")
    return DonorChoices(policy, bool(args.yes or values.get("consent")), int(limit), gpus, list(exclude))


def choose_gpus(visible: int, use: list[int] | None, exclude: list[int]) -> list[int]:
    """The CUDA devices to serve on: ``use`` (default: every visible one) less ``exclude``;
    VolunteerError naming what torch sees when a number is not there or nothing is left."""
    wanted = list(dict.fromkeys(use)) if use is not None else list(range(visible))
    missing = [i for i in wanted if i >= visible]
    if missing:
        raise VolunteerError(f"no CUDA device cuda:{missing[0]} (torch sees {visible} CUDA device(s)); check --gpus")
    chosen = [i for i in wanted if i not in set(exclude)]
    if not chosen:
        raise VolunteerError("--gpus and --exclude-gpus leave no GPU to use; use --device cpu to compute on the CPU")
    return chosen


__all__ = ["DonorChoices", "add_donor_flags", "choose_gpus", "donor_choices"]
