"""volunteer: donate GPUs to train mixture-of-experts models over a libp2p swarm."""

__version__ = "0.1.0"
