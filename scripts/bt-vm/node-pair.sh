#!/bin/bash
# Runs in the guest (scripts/bt-vm/run.sh): two `thali-node run --bluetooth --no-wifi` peers, alice on hci0
# and bob on hci1, that know each other as contacts. Alice queues a text and a file for bob, bob a text for
# alice; both run until every item arrived (or TIMEOUT seconds). Each inbox must hold exactly its items,
# once. Prints one JSON line of figures; exit 0 when everything arrived intact.
# Usage: node-pair.sh THALI_NODE [FILE_BYTES] [TIMEOUT]
set -u
node="$1"; file_bytes="${2:-65536}"; timeout="${3:-90}"
work=/tmp/thali-node-pair
rm -rf "$work"; mkdir -p "$work"
echo "[guest] the radio is emulated: BlueZ btvirt controllers in a QEMU guest"

key() { "$node" identity show --home "$work/$1" --json | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["public_key"])'; }
for name in alice bob; do "$node" identity create --home "$work/$name" >/dev/null || exit 1; done
"$node" contacts add --home "$work/alice" bob "$(key bob)" >/dev/null || exit 1
"$node" contacts add --home "$work/bob" alice "$(key alice)" >/dev/null || exit 1
head -c "$file_bytes" /dev/urandom >"$work/payload.bin"
"$node" send --home "$work/alice" bob "hello bob, over Bluetooth" >/dev/null || exit 1
"$node" send --home "$work/alice" bob --file "$work/payload.bin" >/dev/null || exit 1
"$node" send --home "$work/bob" alice "hello alice, over Bluetooth" >/dev/null || exit 1

"$node" run --home "$work/alice" --bluetooth hci0 --no-wifi --json >"$work/alice.log" 2>"$work/alice.err" &
alice=$!
"$node" run --home "$work/bob" --bluetooth hci1 --no-wifi --json >"$work/bob.log" 2>"$work/bob.err" &
bob=$!

count() { "$node" inbox --home "$work/$1" --json | /usr/bin/python3 -c 'import json, sys; print(len(json.load(sys.stdin)))'; }
deadline=$(( $(date +%s) + timeout ))
while [ "$(date +%s)" -lt "$deadline" ]; do
    [ "$(count bob)" -ge 2 ] && [ "$(count alice)" -ge 1 ] && break
    sleep 0.5
done
kill -TERM "$alice" "$bob" 2>/dev/null
wait "$alice" "$bob" 2>/dev/null

echo "--- alice"; cat "$work/alice.log"; grep "page scan" "$work/alice.err"; tail -5 "$work/alice.err"
echo "--- bob"; cat "$work/bob.log"; grep "page scan" "$work/bob.err"; tail -5 "$work/bob.err"
/usr/bin/python3 - "$node" "$work" <<'EOF'
import hashlib, json, subprocess, sys
node, work = sys.argv[1], sys.argv[2]
# Each event's "t" counts seconds from its run's start.
received = []
for name in ("alice", "bob"):
    for line in open(f"{work}/{name}.log"):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "received":
            received.append(event["t"])
def inbox(name):
    return json.loads(subprocess.run([node, "inbox", "--home", f"{work}/{name}", "--json"], capture_output=True, check=True).stdout)
alice, bob = inbox("alice"), inbox("bob")
payload = open(f"{work}/payload.bin", "rb").read()
texts_bob = [i.get("text") for i in bob if i.get("kind") == "text"]
files_bob = [i for i in bob if i.get("kind") == "file"]
file_ok = False
if len(files_bob) == 1:
    path = files_bob[0].get("file_path")
    if path:
        file_ok = hashlib.sha256(open(path, "rb").read()).digest() == hashlib.sha256(payload).digest()
    else:
        file_ok = files_bob[0].get("size") == len(payload)
ok = (len(alice) == 1 and alice[0].get("text") == "hello alice, over Bluetooth"
      and len(bob) == 2 and texts_bob == ["hello bob, over Bluetooth"] and file_ok)
print(json.dumps({"node_pair_ok": ok, "node_first_delivery_s": min(received) if received else None,
                  "node_all_delivered_s": max(received) if received else None, "file_bytes": len(payload),
                  "alice_inbox": len(alice), "bob_inbox": len(bob)}, sort_keys=True))
sys.exit(0 if ok else 1)
EOF
