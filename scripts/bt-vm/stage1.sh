#!/bin/busybox sh
# PID 1 in the initramfs: mount this machine's root (9p, read-only) under a tmpfs overlay and the job
# folder, then continue as stage 2 from the real filesystem.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for module in $(cat /modules.order); do insmod "/modules/$module" || echo "[stage1] insmod $module failed"; done
tries=0
until grep -qs host /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag || [ $tries -gt 500 ]; do tries=$((tries + 1)); sleep 0.01; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /host || { echo "[stage1] cannot mount the host"; poweroff -f; }
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /root || { echo "[stage1] overlay failed"; poweroff -f; }
mkdir -p /root/bt-job
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 job /root/bt-job || echo "[stage1] cannot mount the job folder"
umount /proc /sys /dev 2>/dev/null
exec switch_root /root /bin/bash /bt-job/stage2.sh
