#!/bin/bash
# The demo over real BlueZ: boots the bt-vm guest and runs `thali-node demo --bluetooth` there, Alice on
# hci0 and Bob on hci1 (with --three, also Carol on hci2).
# Usage: scripts/bt-vm/demo.sh [--three] [THALI_NODE] [demo options...]   (default: .build/debug/thali-node)
#
# Two peers by default: with three emulated controllers in one guest kernel, Debian's 6.1 kernel sooner or
# later hits a list corruption in its RFCOMM session teardown (krfcommd, rfcomm_session_del) and the
# demo dies with it (spec/ble-binding.md §7). Each controller is a separate device on real hardware.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
controllers=2
if [ "${1:-}" = --three ]; then controllers=3; shift; fi
node="${1:-$root/.build/debug/thali-node}"
[ $# -gt 0 ] && shift
[ -x "$node" ] || { echo "no thali-node at $node: build it first (swift build)" >&2; exit 2; }
adapters="hci0,hci1"; [ "$controllers" = 3 ] && adapters="hci0,hci1,hci2"
echo "The radio is emulated: BlueZ's btvirt controllers in a QEMU guest; the kernel, bluetoothd and thali-node are real."
# The controllers start as bluetoothd leaves them (page scan off): each node turns page scan on itself.
export BT_VM_CONTROLLERS="$controllers" BT_VM_TIMEOUT="${BT_VM_TIMEOUT:-240}" BT_VM_CONNECTABLE="${BT_VM_CONNECTABLE:-0}"
exec "$root/scripts/bt-vm/run.sh" "$node" demo --bluetooth --adapters "$adapters" "$@"
