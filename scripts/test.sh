#!/usr/bin/env bash
# Runs the whole test suite: installs the test peers, builds once, runs every test target.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --test
export THALI_TEST_VENV="$PWD/.venv-test"
# Every peer is installed now: a test that cannot find one fails instead of skipping.
export THALI_REQUIRE_PEERS=1
swift build --build-tests
# DocC for every library module: no warnings, every public symbol documented.
scripts/docs.sh
# The Debian package of this build, installed, run and removed in a fresh root; its failure fails the
# command at the end, after the other tests have run.
package_status=0
scripts/package-test.sh || package_status=1
# The failures are printed again at the end, where a log's tail shows them.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Serially: on 2 cores, bulk-transfer suites would starve the timing-bound discovery tests.
if ! swift test --skip-build --no-parallel "$@" 2>&1 | tee "$log"; then
    echo "=== failed tests and their issues ==="
    grep -E "✘|error:|Fatal error|Crash|signal" "$log" | head -200
    (( package_status == 0 )) || echo "=== and the package test failed (package-test: lines above) ==="
    exit 1
fi
if (( package_status )); then
    echo "=== the package test failed (package-test: lines above) ==="
    exit 1
fi
