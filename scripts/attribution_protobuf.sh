#!/usr/bin/env bash
# The Kubernetes attribution tests under the oldest (4.21.12) and the newest protobuf the Agent
# ships, each in a virtualenv of its own (scripts/protobuf_check.sh). The two are independent, so
# they run side by side; each one's output is printed whole when both are done.
# Usage: scripts/attribution_protobuf.sh <test paths...>
set -uo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
versions=(latest 4.21.12)
pids=()
for version in "${versions[@]}"; do
    scripts/protobuf_check.sh "$version" "$@" > "$logs/$version" 2>&1 &
    pids+=($!)
done
status=0
for i in "${!versions[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "== protobuf ${versions[$i]}"
    cat "$logs/${versions[$i]}"
done
exit $status
