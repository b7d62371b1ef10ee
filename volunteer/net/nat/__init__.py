"""NAT traversal for the Host: AutoNAT reachability, circuit relay v2 reservations, observed-address
mapping and DCUtR hole punching, driven by ``manager.NatManager``."""
