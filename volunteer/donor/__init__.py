"""The donor layer: what a volunteer's owner decides about a running node, beside the commands.

``steward`` applies the donor's choice (fold / pause / finish, ``fold.Conduct``), the run-when
policies (``policy.RunPolicy`` over ``probes``' observations) and self-care (``selfcare``) to a
node through the protocol ``control.NodeControl`` declares, and nothing else of it; ``history``
and ``contributions`` keep what the volunteer gave. The layer sits above the node and beneath
the CLI, and imports nothing of the node, the DHT, the experts, the replicas or the kinds (an
import-linter contract in ``pyproject.toml`` says so).
"""

from .control import Finished, NodeControl

__all__ = ["Finished", "NodeControl"]
