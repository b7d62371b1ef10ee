#!/usr/bin/env bash
# Regenerate the *_pb2.py modules from the .proto files (needs grpcio-tools; the output is committed).
set -euo pipefail
cd "$(dirname "$0")"
python -m grpc_tools.protoc -I. --python_out=. ./*.proto
# protoc writes absolute imports; make them package-relative.
sed -i 's/^import \([a-z_]*_pb2\) as/from . import \1 as/' ./*_pb2.py
