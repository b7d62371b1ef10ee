"""libp2p in pure Python on trio: identities, multiaddrs, transports, Noise, yamux, the Host and its
services (identify, ping, perf, stream pool), and NAT traversal in ``nat/``; the floor every other
package stands on."""
