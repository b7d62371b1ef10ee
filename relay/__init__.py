"""The public relay node: circuit relay v2 hop service with limits and accounting, AutoNAT server,
DHT bootstrap for the swarms it serves, metrics and its live view."""
