#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer (the Fuzz/ package, built with -sanitize=fuzzer,address, optimised:
# 5.4 times the executions per second of a debug build through NIO's HTTP pipeline, measured 2026-11-25;
# FUZZ_CONFIGURATION=debug builds without optimisation, with swift-nio's debug-only assertions).
#
#   scripts/fuzz.sh --list              the harness names, one per line
#   scripts/fuzz.sh --seed              (re)write every harness's seeds into Fuzz/Corpus/<name>/
#   scripts/fuzz.sh [TARGET] [SECONDS]  fuzz TARGET (default: every harness, one after another) for
#                                       SECONDS each (default 60); prints executions, exec/s, coverage
#                                       and findings per harness; exits non-zero on a finding
#   scripts/fuzz.sh --merge TARGET      minimise what the fuzzer found (Fuzz/.work/<name>) into the
#                                       committed corpus Fuzz/Corpus/<name>/
#
# New inputs go to Fuzz/.work/<name>/ (not committed); findings (crash-*, timeout-*, oom-*) to
# Fuzz/Findings/<name>/. A finding becomes a regression input by moving it into Fuzz/Corpus/<name>/,
# where the tests replay it (Tests/ThaliFuzzHarnessesTests). Runs one job at a time: 2 cores here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
fuzz="$root/Fuzz"
cd "$root"
configuration="${FUZZ_CONFIGURATION:-release}"
case "$configuration" in release|debug) ;; *) echo "fuzz.sh: FUZZ_CONFIGURATION is release or debug" >&2; exit 2 ;; esac
binaries="$fuzz/.build/$configuration"

harness_table() { sed -n 's/^    ("\([a-z0-9-]*\)", "\([A-Za-z0-9]*\)"),$/\1 \2/p' "$fuzz/Package.swift"; }
list() { harness_table | cut -d' ' -f1; }
target_of() { harness_table | awk -v n="$1" '$1 == n { print $2 }'; }

build() {
    [ -n "${FUZZ_NO_BUILD:-}" ] && return 0  # several lanes share one build (FUZZ_NO_BUILD=1)
    bash "$root/scripts/bootstrap.sh" >/dev/null
    # SwiftPM kept a stale build plan for the path dependency once (a source file new in the main
    # package was not compiled): plan afresh every time.
    rm -f "$fuzz/.build/$configuration.yaml"
    local log status=0
    log="$(mktemp)"
    (cd "$fuzz" && swift build -c "$configuration" -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library) >"$log" 2>&1 || status=$?
    grep -Ev "ld.gold: warning: Cannot export local symbol|^\[|^Build complete|^Building for" "$log" >&2 || true
    rm -f "$log"
    # A failed build must not fall back to the binaries of an earlier one.
    [ "$status" = 0 ] || { echo "fuzz.sh: the Fuzz package did not build" >&2; exit 1; }
}

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}"
export SWIFT_BACKTRACE="enable=no"  # libFuzzer and ASan report crashes; the Swift backtracer confuses ASan

case "${1:-}" in
--list) list; exit 0 ;;
--seed) build; "$binaries/FuzzSeeds" "$fuzz/Corpus"; exit 0 ;;
--merge)
    name="${2:?usage: scripts/fuzz.sh --merge TARGET}"
    target="$(target_of "$name")"; [ -n "$target" ] || { echo "fuzz.sh: no harness $name" >&2; exit 2; }
    build
    merged="$(mktemp -d)"
    "$binaries/$target" -merge=1 "$merged" "$fuzz/Corpus/$name" "$fuzz/.work/$name" >/dev/null 2>&1
    rm -f "$fuzz/Corpus/$name"/[0-9a-f]*  # earlier minimised units; seeds and regressions stay
    # libFuzzer names a merged unit by the SHA-1 of its content: one whose name is the SHA-1 of a seed or
    # regression file is that file already.
    declare -A kept=()
    while read -r sum _; do kept[$sum]=1; done < <(cd "$fuzz/Corpus/$name" && sha1sum -- *)
    for file in "$merged"/*; do
        [ -n "${kept[${file##*/}]:-}" ] || cp "$file" "$fuzz/Corpus/$name/"
    done
    rm -rf "$merged"
    echo "$name: $(ls "$fuzz/Corpus/$name" | wc -l) corpus files"
    exit 0 ;;
-h|--help) sed -n '2,16p' "$0"; exit 0 ;;
esac

targets="${1:-all}"; seconds="${2:-60}"
[ "$targets" = all ] && targets="$(list)"
for name in $targets; do [ -n "$(target_of "$name")" ] || { echo "fuzz.sh: no harness $name (see --list)" >&2; exit 2; }; done
build

status=0
printf '%-26s %12s %9s %8s %9s %s\n' harness executions exec/s cov features findings
for name in $targets; do
    target="$(target_of "$name")"
    mkdir -p "$fuzz/.work/$name" "$fuzz/Findings/$name"
    log="$fuzz/.work/$name.log"
    before="$(ls "$fuzz/Findings/$name" | wc -l)"
    nice -n 10 "$binaries/$target" "$fuzz/.work/$name" "$fuzz/Corpus/$name" \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 -print_pcs=0 \
        -artifact_prefix="$fuzz/Findings/$name/" -close_fd_mask=1 >"$log" 2>&1 || true
    executions="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
    coverage="$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)"
    after="$(ls "$fuzz/Findings/$name" | wc -l)"
    findings=$((after - before))
    printf '%-26s %12s %9s %8s %9s %s\n' "$name" "${executions:-?}" "${rate:-?}" \
        "$(echo "$coverage" | awk '{print $2}')" "$(echo "$coverage" | awk '{print $4}')" "$findings"
    if [ "$findings" -gt 0 ] || [ -z "$executions" ]; then
        status=1
        echo "  $name: see $log and $fuzz/Findings/$name/" >&2
        grep -E "invariant broken|ERROR: |Fatal error|SUMMARY" "$log" | head -5 | sed 's/^/  /' >&2 || true
    fi
done
exit $status
