"""volunteer: donate GPUs to train mixture-of-experts models over a libp2p swarm.

Trainers: ``from volunteer import Swarm, RemoteMixtureOfExperts, RemoteExpert`` (and ``TrustPolicy``,
how often their replies are audited); volunteers (and
tests, benchmarks): ``from volunteer import open_volunteer, VolunteerOptions``. All imported lazily,
so ``volunteer id`` or a relay never loads torch.
"""

__version__ = "0.1.0"

_LAZY = {
    "Swarm": ("volunteer.swarm", "Swarm"),
    "RemoteExpert": ("volunteer.experts.client", "RemoteExpert"),
    "RemoteMixtureOfExperts": ("volunteer.experts.moe", "RemoteMixtureOfExperts"),
    "TrustPolicy": ("volunteer.experts.trust", "TrustPolicy"),
    "open_volunteer": ("volunteer.node", "open_volunteer"),
    "VolunteerNode": ("volunteer.node", "VolunteerNode"),
    "VolunteerOptions": ("volunteer.node", "VolunteerOptions"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'volunteer' has no attribute {name!r}")


__all__ = [
    "RemoteExpert", "RemoteMixtureOfExperts", "Swarm", "TrustPolicy", "VolunteerNode", "VolunteerOptions", "__version__", "open_volunteer",
]
