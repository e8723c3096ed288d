#!/usr/bin/env bash
# Runs test paths under one protobuf release, in a virtualenv of its own (.venv-protobuf-<version>).
# Agents ship protobuf 4.21 through 7.x next to this check; `make test` runs the Kubernetes
# attribution tests under the oldest (4.21.12) and the newest ("latest").
# Usage: scripts/protobuf_check.sh <version|latest> <test paths...>
set -euo pipefail
cd "$(dirname "$0")/.."

version=$1
shift
venv=".venv-protobuf-$version"
stamp="$venv/.installed"

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
if [ ! -e "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install -q -e ".[check,deps]" pytest
    touch "$stamp"
fi
# Installing the project brings the protobuf datadog-checks-base[deps] pins; this replaces it.
if [ "$version" = latest ]; then
    "$venv/bin/python" -m pip install -q --upgrade protobuf
else
    "$venv/bin/python" -m pip install -q "protobuf==$version"
fi

"$venv/bin/python" -c 'import google.protobuf, grpc; print("protobuf", google.protobuf.__version__, "grpcio", grpc.__version__)'
exec "$venv/bin/python" -m pytest -q "$@"
