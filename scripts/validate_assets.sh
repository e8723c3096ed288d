#!/usr/bin/env bash
# Datadog's own offline validators on this check's assets: ddev for metadata.csv,
# service_checks.json and the dashboards, datadog_checks.dev's manifest v2 validators for
# manifest.json. They expect an integrations repository (<root>/<check>/...), so they run on a
# temporary root whose gpu_monitoring entry links to this repository. ddev pins an older
# datadog-checks-dev than the tests use, so it lives in a virtualenv of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

venv=.venv-ddev
if [ ! -x "$venv/bin/ddev" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "ddev==14.4.0"
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
ln -s "$repo" "$root/gpu_monitoring"
git -C "$root" init -q

cd "$root"
export DDEV_SKIP_UPGRADE_CHECK=1
"$repo/$venv/bin/ddev" --here validate metadata gpu_monitoring
"$repo/$venv/bin/ddev" --here validate service-checks gpu_monitoring
if ls "$repo"/assets/dashboards/*.json >/dev/null 2>&1; then
    "$repo/$venv/bin/ddev" --here validate dashboards gpu_monitoring
fi
"$repo/$venv/bin/python" "$repo/scripts/validate_manifest.py" "$root"
