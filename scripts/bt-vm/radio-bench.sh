#!/bin/bash
# Runs in the guest (scripts/bt-vm/run.sh): the binding over the real stack between hci0 and hci1
# (`thali-node bench ble --radio`), then the same transfer over a raw Python RFCOMM socket pair writing
# 4 KiB per send() (blocking sends of 16 KiB and more stall for ~30 s in the kernel: spec/ble-binding.md §7).
# The exit status is ours; the raw figures are for comparison.
# Usage: radio-bench.sh THALI_NODE [BYTES]
set -u
node="$1"; bytes="${2:-65536}"
here="$(cd "$(dirname "$0")" && pwd)"
address() { hciconfig "$1" | awk '/BD Address/ { print $3 }'; }
echo "[guest] the radio is emulated: BlueZ btvirt controllers in a QEMU guest"
"$node" bench ble --radio hci0,hci1 --radio-bytes "$bytes" --json; ours=$?
timeout 90 /usr/bin/python3 "$here/rfcomm_raw.py" "$(address hci0)" "$(address hci1)" "$bytes" 4096 || echo "[guest] the raw comparison failed"
exit $ours
