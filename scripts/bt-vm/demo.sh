#!/bin/bash
# The demo over real BlueZ: boots the bt-vm guest with three virtual controllers and runs
# `thali-node demo --bluetooth` there (Alice on hci0, Bob on hci1, Carol on hci2).
# Usage: scripts/bt-vm/demo.sh [THALI_NODE] [demo options...]   (default: .build/debug/thali-node)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
node="${1:-$root/.build/debug/thali-node}"
[ $# -gt 0 ] && shift
[ -x "$node" ] || { echo "no thali-node at $node: build it first (swift build)" >&2; exit 2; }
echo "The radio is emulated: BlueZ's btvirt controllers in a QEMU guest; the kernel, bluetoothd and thali-node are real."
export BT_VM_CONTROLLERS=3 BT_VM_TIMEOUT="${BT_VM_TIMEOUT:-240}"
exec "$root/scripts/bt-vm/run.sh" "$node" demo --bluetooth --adapters hci0,hci1,hci2 "$@"
