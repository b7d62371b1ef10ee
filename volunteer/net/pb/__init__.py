"""Protobuf messages that libp2p itself defines (generated from the .proto files beside this; see regenerate.sh)."""

from . import autonat_pb2, circuit_pb2, dcutr_pb2, envelope_pb2, identify_pb2, keys_pb2, noise_pb2

__all__ = ["autonat_pb2", "circuit_pb2", "dcutr_pb2", "envelope_pb2", "identify_pb2", "keys_pb2", "noise_pb2"]
