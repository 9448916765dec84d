#!/usr/bin/env bash
# Builds the DocC documentation of every library module and fails on any warning (a broken symbol link,
# an undocumented parameter) or on a public symbol of ours without a documentation comment.
# Archives: .build/plugins/Swift-DocC/outputs/<Module>.doccarchive.
set -euo pipefail
cd "$(dirname "$0")/.."
modules=(ThaliSupport ThaliAdmission ThaliBeacons ThaliPSKTLS ThaliSSDP TCPMultiplexer ThaliBluetoothAddress ThaliBLEBinding ThaliConformance ThaliNodeCore ThaliNodeBluetooth)
targets=()
for module in "${modules[@]}"; do targets+=(--target "$module"); done
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! swift package generate-documentation "${targets[@]}" --warnings-as-errors >"$log" 2>&1; then
    grep -vE '^\[[0-9]+/[0-9]+\]' "$log" >&2
    echo "docs: generate-documentation failed (warnings are errors)" >&2
    exit 1
fi
if grep -E '^(warning|error):' "$log" >&2; then
    echo "docs: generate-documentation printed warnings" >&2
    exit 1
fi
# Every public symbol declared in Sources/ has a /// comment (symbols that inherit a protocol's
# documentation, and what the compiler synthesises, are exempt).
python3 - "$PWD/Sources/" .build/*/extracted-symbols/*/ "${modules[@]}" <<'PY'
import glob, json, sys
sources, graphs, modules = sys.argv[1], sys.argv[2], sys.argv[3:]
missing = []
for module in modules:
    for path in glob.glob(f"{graphs}{module}/{module}*.symbols.json"):
        for symbol in json.load(open(path))["symbols"]:
            uri = symbol.get("location", {}).get("uri", "")
            if symbol.get("accessLevel") not in ("public", "open") or sources not in uri:
                continue
            if symbol.get("docComment") or "sourceOrigin" in symbol:
                continue
            line = symbol["location"]["position"]["line"] + 1
            missing.append(f"{uri.split(sources, 1)[1]}:{line}: {'.'.join(symbol['pathComponents'])} has no documentation comment")
for entry in sorted(set(missing)):
    print(entry, file=sys.stderr)
if missing:
    sys.exit(f"docs: {len(set(missing))} public symbol(s) undocumented")
PY
echo "docs: ${#modules[@]} modules documented without warnings: ${modules[*]}"
