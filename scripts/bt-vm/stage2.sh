#!/bin/bash
# PID 1 on the real filesystem: D-Bus, virtual controllers (btvirt, one process so they share the air),
# bluetoothd, adapters powered and connectable; then the command, its status, and power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
job=/bt-job
source "$job/environment.sh"
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm; mount -t tmpfs tmpfs /run
mkdir -p /run/dbus /var/lib/bluetooth /tmp
ip link set lo up
controllers="${BT_VM_CONTROLLERS:-2}"
diagnose() {
    echo "[stage2] diagnosis at uptime $(cut -d' ' -f1 /proc/uptime) s: controllers: $(ls /sys/class/bluetooth | tr '\n' ' ')"
    btmgmt info 2>&1 | head -20
    dmesg | grep -i -E 'bluetooth|hci|vhci' | tail -20
}
finish() {
    if [ "$1" -ge 90 ]; then diagnose; fi  # the harness failed, not the command
    echo "$1" >"$job/status"
    echo "[stage2] status $1 at uptime $(cut -d' ' -f1 /proc/uptime) s"
    sync
    poweroff -f 2>/dev/null || echo o >/proc/sysrq-trigger
    sleep 10
}
adapter() { dbus-send --system --print-reply --dest=org.bluez "/org/bluez/hci$1" org.freedesktop.DBus.Properties."$2" string:org.bluez.Adapter1 "${@:3}"; }

modprobe bluetooth && modprobe hci_vhci && modprobe rfcomm || { echo "[stage2] no Bluetooth modules"; finish 90; }
dbus-daemon --system --fork || finish 91
# Under TCG the kernel's initialisation of a virtual controller sometimes times out; that controller
# then never reaches the management interface (bluetoothd never sees it). Start btvirt again until
# every controller is managed.
managed() { btmgmt info 2>/dev/null | grep -c '^hci[0-9]*:'; }
for attempt in 1 2 3; do
    btvirt -l"$controllers" >"$job/btvirt.log" 2>&1 &
    btvirt=$!
    for _ in $(seq 150); do [ "$(managed)" -ge "$controllers" ] && break; sleep 0.1; done
    [ "$(managed)" -ge "$controllers" ] && break
    echo "[stage2] attempt $attempt: only $(managed) of $controllers controllers managed; restarting btvirt"
    dmesg | grep -i -E 'bluetooth|hci' | tail -5
    kill "$btvirt"; wait "$btvirt" 2>/dev/null
    for _ in $(seq 50); do [ "$(managed)" -eq 0 ] && break; sleep 0.1; done
done
[ "$(managed)" -ge "$controllers" ] || { echo "[stage2] the virtual controllers did not come up"; finish 93; }
echo "[stage2] controllers at uptime $(cut -d' ' -f1 /proc/uptime) s: $(ls /sys/class/bluetooth | tr '\n' ' ')"
/usr/libexec/bluetooth/bluetoothd -n $BT_VM_BLUETOOTHD_ARGS >"$job/bluetoothd.log" 2>&1 &
last=$((controllers - 1))
# Under emulation on a loaded host bluetoothd can take tens of seconds to publish the adapters.
uptime_s() { cut -d' ' -f1 /proc/uptime | cut -d. -f1; }
deadline=$(( $(uptime_s) + 60 ))
for index in $(seq 0 $last); do
    until adapter "$index" Get string:Address >/dev/null 2>&1 || [ "$(uptime_s)" -gt $deadline ]; do sleep 0.1; done
    adapter "$index" Set string:Powered variant:boolean:true >/dev/null || { echo "[stage2] cannot power hci$index"; finish 92; }
    until adapter "$index" Get string:Powered 2>/dev/null | grep -q 'boolean true' || [ "$(uptime_s)" -gt $deadline ]; do sleep 0.1; done
    # bluetoothd 5.66 leaves page scan off: without it incoming RFCOMM connects time out (EHOSTDOWN).
    # Nodes turn it on themselves; BT_VM_CONNECTABLE=0 leaves that to them.
    [ "${BT_VM_CONNECTABLE:-1}" = 1 ] && btmgmt --index "$index" connectable on >/dev/null
    btmgmt --index "$index" bondable on >/dev/null
done
echo "[stage2] bluetooth ready at uptime $(cut -d' ' -f1 /proc/uptime) s: $(hciconfig | awk '/BD Address/ { printf "%s ", $3 }')"
cd "$BT_VM_DIRECTORY" 2>/dev/null || cd /
bash "$job/command.sh"
finish $?
