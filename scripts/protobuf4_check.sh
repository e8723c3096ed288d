#!/usr/bin/env bash
# Runs the pod-resources tests, plus any test paths given as arguments, under protobuf 4.21: the
# oldest major an Agent ships next to this check. Uses a virtualenv of its own, .venv-protobuf4.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=.venv-protobuf4
stamp="$venv/.installed"

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
    # Keeps the environment out of `git status` without touching the project's .gitignore.
    echo '*' > "$venv/.gitignore"
fi

# Installing the project pulls the protobuf that datadog-checks-base[deps] pins, so the older one is
# forced afterwards, on every run, in case something upgraded it in between.
if [ ! -e "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install -q -e . pytest
    touch "$stamp"
fi
"$venv/bin/python" -m pip install -q 'protobuf==4.21.12'

"$venv/bin/python" -c 'import google.protobuf, grpc; print("protobuf", google.protobuf.__version__, "grpcio", grpc.__version__)'
exec "$venv/bin/python" -m pytest -q tests/test_pod_resources.py "$@"
