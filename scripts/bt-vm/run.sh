#!/usr/bin/env bash
# Runs a command inside a throwaway QEMU guest that has real Linux Bluetooth: Debian's own kernel (with
# the bluetooth, rfcomm and hci_vhci modules), BlueZ's btvirt with virtual controllers sharing one
# virtual air, the system dbus-daemon and the real bluetoothd. The guest sees this machine's files
# read-only (9p, with a tmpfs overlay: writes vanish), so binaries built here run there unchanged; a job
# folder is shared read-write at /bt-job. The guest has no network. The radio is emulated.
#
#   scripts/bt-vm/run.sh [--setup-only] COMMAND...   the command runs in the guest, in the current folder
#
# Exit status: the command's, or 100+ when the VM itself failed (no guest status: 103).
# Environment: BT_VM_CONTROLLERS (2), BT_VM_CPUS (2 when this machine has two cores, else 1),
# BT_VM_MEMORY (MiB, 512), BT_VM_TIMEOUT (s, 180), BT_VM_JOB (the job folder; default a new temporary
# one, removed afterwards), BT_VM_BLUETOOTHD_ARGS (e.g. -d),
# BT_VM_CONNECTABLE (1: the harness turns page scan on; 0: leaves the adapters as bluetoothd set them).
# Logs: console.log, bluetoothd.log and btvirt.log in the job folder.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
state=/var/tmp/thali-bt-vm
mkdir -p "$state"

# Packages, installed once (Debian 12).
packages="qemu-system-x86 linux-image-amd64 bluez bluez-test-tools busybox-static cpio kmod dbus python3 iproute2 xz-utils zstd"
missing=""
for package in $packages; do dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"; done
if [ -n "$missing" ]; then
    echo "[bt-vm] installing:$missing" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2
fi

# KVM only with real VMX/SVM; nested "kvm_pvm" cannot boot a stock kernel, so emulate (TCG) there.
if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
    accelerator=(-enable-kvm -cpu host,-arch-capabilities)
else
    accelerator=(-accel tcg -cpu max)
fi

kernel="$(ls -1 /boot/vmlinuz-*-amd64 | sort -V | tail -1)"
version="${kernel#/boot/vmlinuz-}"
[ -d "/lib/modules/$version/kernel/net/bluetooth" ] || { echo "[bt-vm] $kernel has no Bluetooth modules" >&2; exit 102; }

# The initramfs: busybox and the modules to mount the host's root (virtio, 9p, overlay). Cached.
initramfs="$state/initramfs-$version.cpio.gz"
if [ ! -s "$initramfs" ] || [ "$here/stage1.sh" -nt "$initramfs" ]; then
    echo "[bt-vm] building $initramfs" >&2
    tree="$(mktemp -d)"
    mkdir -p "$tree"/{bin,modules,proc,sys,dev,host,rw,root}
    cp /bin/busybox "$tree/bin/busybox"
    install -m 755 "$here/stage1.sh" "$tree/init"
    for module in virtio_pci 9pnet_virtio 9p overlay; do
        modprobe -S "$version" --show-depends "$module" | awk '$1 == "insmod" { print $2 }'
    done | awk '!seen[$0]++' | while read -r file; do
        name="$(basename "$file")"; name="${name%.xz}"; name="${name%.zst}"
        case "$file" in
            *.xz) xz -dc "$file" >"$tree/modules/$name" ;;
            *.zst) zstd -dcq "$file" >"$tree/modules/$name" ;;
            *) cp "$file" "$tree/modules/$name" ;;
        esac
        echo "$name" >>"$tree/modules.order"
    done
    (cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1) >"$initramfs.tmp"
    mv "$initramfs.tmp" "$initramfs"
    rm -rf "$tree"
fi
if [ "${1:-}" = --setup-only ]; then echo "[bt-vm] ready: $kernel"; exit 0; fi
[ $# -gt 0 ] || { echo "usage: scripts/bt-vm/run.sh [--setup-only] COMMAND..." >&2; exit 2; }

# Two vCPUs (TCG runs each on a host thread) keep btvirt, bluetoothd and the nodes from starving each
# other: the two-node run takes about a third of its one-vCPU time.
cpus="${BT_VM_CPUS:-$(( $(nproc) >= 2 ? 2 : 1 ))}"

job="${BT_VM_JOB:-$(mktemp -d /tmp/thali-bt-job.XXXXXX)}"
mkdir -p "$job"
rm -f "$job/status"
cp "$here/stage2.sh" "$job/stage2.sh"
printf '%q ' "$@" >"$job/command.sh"; echo >>"$job/command.sh"
{
    printf 'export BT_VM_DIRECTORY=%q\n' "$PWD"
    printf 'export BT_VM_CONTROLLERS=%q\n' "${BT_VM_CONTROLLERS:-2}"
    printf 'export BT_VM_BLUETOOTHD_ARGS=%q\n' "${BT_VM_BLUETOOTHD_ARGS:-}"
    printf 'export BT_VM_CONNECTABLE=%q\n' "${BT_VM_CONNECTABLE:-1}"
} >"$job/environment.sh"

echo "[bt-vm] booting $kernel (${accelerator[1]}, $cpus vCPU), job $job" >&2
started="$(date +%s.%N)"
set +e
timeout "${BT_VM_TIMEOUT:-180}" qemu-system-x86_64 "${accelerator[@]}" -smp "$cpus" -m "${BT_VM_MEMORY:-512}" \
    -nodefaults -no-user-config -nic none -display none -no-reboot -serial stdio -monitor none \
    -kernel "$kernel" -initrd "$initramfs" -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init" \
    -fsdev local,id=host,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=host,mount_tag=host \
    -fsdev local,id=job,path="$job",security_model=none,multidevs=remap \
    -device virtio-9p-pci,fsdev=job,mount_tag=job \
    </dev/null >"$job/console.log" 2>&1
qemu=$?
set -e
# The guest's output without the kernel's own lines (the serial console ends lines with CR LF).
tr -d '\r' <"$job/console.log" | grep -v -e '^\[ *[0-9]*\.[0-9]*\]' -e '^$' >&2 || true
echo "[bt-vm] guest ended (qemu $qemu) after $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $started }") s" >&2
status=103
[ -s "$job/status" ] && status="$(cat "$job/status")"
[ -n "${BT_VM_JOB:-}" ] || rm -rf "$job"
exit "$status"
