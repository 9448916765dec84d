#!/usr/bin/env bash
# Writes a manual page per command of a thali-node binary into DIR, named as git names its pages
# (thali-node.1, thali-node-run.1, thali-node-identity-create.1, ...), generated from the command
# definitions by swift-argument-parser's generate-manual (the tool behind its generate-manual plugin),
# built once from the resolved dependency into .build-manual. Usage: packaging/manuals.sh BINARY DIR
set -euo pipefail
binary=$1
out=$2
cd "$(dirname "$0")/.."

parser=.build/checkouts/swift-argument-parser
[[ -d "$parser" ]] || swift package resolve >/dev/null
swift build --package-path "$parser" --scratch-path .build-manual --product generate-manual >/dev/null
tool=$(swift build --package-path "$parser" --scratch-path .build-manual --show-bin-path)/generate-manual

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
# The commit's date, not today's: the same commit gives the same pages.
date=$(git log -1 --format=%cs 2>/dev/null || date -u +%F)
"$tool" "$binary" --multi-page --date "$date" --output-directory "$raw"

mkdir -p "$out"
for page in "$raw"/*.1; do
    name=$(basename "$page" .1)
    # thali-node.identity.create -> thali-node-identity-create, in the file name, its title and its links.
    sed -E '/^\.(Dt|Xr) /{s/\./-/g; s/^-/./}' "$page" >"$out/${name//./-}.1"
done
