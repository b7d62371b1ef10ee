#!/usr/bin/env bash
# Regenerate the *_pb2.py modules from the .proto files; the output is committed. Needs
# grpcio-tools: PYTHON defaults to the hivemind benchmark venv, which has it.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-../../../.bench/hm/bin/python}"
"$PYTHON" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. ./*.proto
