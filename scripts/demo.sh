#!/usr/bin/env bash
# Runs the main job: builds thali-node (release) and runs its demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
swift build -c release --product thali-node
exec .build/release/thali-node demo "$@"
