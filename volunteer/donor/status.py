"""The donor layer's pieces of the status snapshot, typed: what ``volunteer status --json``, the
dashboard and the web page read of the steward (``conduct``, ``policy``, ``self_care``) and of
the contribution record (``contributions``). The keys are those the readers always read; these
declarations let a checker hold a reader to them.
"""

from __future__ import annotations

from typing import TypedDict


class EventView(TypedDict):
    """One change of what the daemon does (``fold.Event``)."""

    time: float
    action: str
    reason: str
    origin: str


class VerdictView(TypedDict):
    """The run-when policy's verdict now (``policy.Verdict``)."""

    state: str  # running, paused or waiting
    reason: str
    code: str
    until: float | None
    text: str


class ConductView(TypedDict):
    """The snapshot's ``conduct``: the donor's choice, the verdict, self-care's hold."""

    state: str
    text: str
    serving: bool
    choice: str
    origin: str
    since: float
    verdict: VerdictView
    hold: str | None
    paused_for_s: float | None
    handed_off: bool
    events: list[EventView]


class PolicySettingsView(TypedDict):
    """The run-when settings (``policy.PolicySettings``)."""

    on_battery: bool
    when_idle: float
    max_other_load: float | None
    pause_programs: list[str]
    compute_hours: list[str]
    network_hours: list[str]
    daily_transfer: int | None
    pause_on_gpu_use: bool


class ObservedView(TypedDict):
    """What the last look at the machine saw."""

    on_battery: bool | None
    other_load: float | None
    input_idle_s: float | None
    transferred_today: int
    gpu_users: list[str] | None
    gpu_use: str | None  # None: the GPU-use policy is off; "watched", or why it cannot be


class PolicyView(TypedDict):
    """The snapshot's ``policy``."""

    settings: PolicySettingsView
    lines: list[str]
    verdict: VerdictView
    observed: ObservedView | None


class VisibilityView(TypedDict):
    """The snapshot's ``self_care.visibility``: whether our records are found in the DHT."""

    visible: bool | None
    misses: int
    rejoins: int
    last_seen_age_s: float | None
    last_rejoin_age_s: float | None


class ContactView(TypedDict):
    """The snapshot's ``self_care.contact``: whether the node is in touch with its swarm."""

    cut_off: bool
    cut_off_for_s: float | None
    cut_off_since: float | None
    redials: int
    cut_offs: int


class SelfCareView(TypedDict):
    """The snapshot's ``self_care``."""

    failure_limit: int
    set_aside: dict[str, str]  # uid -> why
    visibility: VisibilityView
    contact: ContactView


class StewardSnapshot(TypedDict):
    """What ``Steward.snapshot`` adds to the status snapshot."""

    conduct: ConductView
    policy: PolicyView
    self_care: SelfCareView


class AskReply(TypedDict):
    """The steward's answer to fold / pause / finish (the control socket's and web page's reply)."""

    ok: bool
    paused: bool
    state: str
    text: str
    changed: bool


class Given(TypedDict):
    """One set of figures of the snapshot's ``contributions``, from a ``history.Bucket`` (the
    record's vocabulary: ``requests`` are its calls answered, ``compute_s`` its GPU and CPU
    seconds together)."""

    requests: int
    samples: int
    compute_s: float
    bytes_sent: int
    trainers: int


class ContributionsView(TypedDict):
    """The snapshot's ``contributions``: this session, the lifetime, and the first moment on
    record (wall-clock seconds; None before anything was given)."""

    session: Given
    total: Given
    since: float | None


class BucketView(TypedDict):
    """One hour's, day's or month's figures (``history.Bucket.as_dict``; trainers as a count)."""

    calls: int
    samples: int
    gpu_s: float
    cpu_s: float
    bytes_sent: int
    traffic: int
    uptime_s: float
    serving_s: float
    trainers: int


__all__ = [
    "AskReply", "BucketView", "ConductView", "ContactView", "ContributionsView", "EventView", "Given", "ObservedView",
    "PolicySettingsView", "PolicyView", "SelfCareView", "StewardSnapshot", "VerdictView", "VisibilityView",
]
