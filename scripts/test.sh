#!/usr/bin/env bash
# Runs the whole test suite: installs the test peers, builds once, runs every test target.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --test
export THALI_TEST_VENV="$PWD/.venv-test"
swift build --build-tests
swift test --skip-build "$@"
