"""Protobufs of hivemind's wire (p2pd persistent calls, DHT, expert runtime), wire-compatible with
hivemind 1.1 and kept in a package of our own so they never mix with volunteer.net.pb."""
