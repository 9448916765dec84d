#!/usr/bin/env bash
# Installs what the suite needs on Debian, idempotently. Usage: scripts/bootstrap.sh [--test]
#   (no flag)  build dependencies: the C libraries the system-library targets link against, and the
#              system SQLite headers GRDB builds against.
#   --test     also the independent peers the tests run: openssl and GnuTLS (PSK-TLS interop),
#              gssdp-discover (SSDP), Go + hashicorp/yamux (multiplexer interop), dbus (BlueZ mock bus),
#              curl, iproute2 (network namespaces), strace (a delivery receiver's system calls), QEMU
#              with Debian's kernel, BlueZ and btvirt (the real-Bluetooth guest of scripts/bt-vm/run.sh),
#              stunnel4 and openssh-server/-client (the peers `bench relay --peers` measures the relay beside:
#              it starts its own sshd on a loopback port; the system's ssh service, when this script installed
#              it, is disabled and stopped), and a Python venv (.venv-test) with python-dbusmock and
#              async-upnp-client; chromium (the
#              conformance HTML report as headless Chromium lays it out); and what --package needs plus the
#              package test's: debootstrap (its fresh root), systemd (systemd-analyze), man-db.
#   --package  also what scripts/package.sh needs: dpkg-dev (dpkg-shlibdeps, dpkg-deb), binutils, git.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(pkg-config libssl-dev libsecp256k1-dev libbluetooth-dev libdbus-1-dev libsqlite3-dev openssl)
if [[ "${1:-}" == "--package" || "${1:-}" == "--test" ]]; then
    packages+=(dpkg-dev binutils git)
fi
if [[ "${1:-}" == "--test" ]]; then
    packages+=(debootstrap systemd man-db)
fi
if [[ "${1:-}" == "--test" ]]; then
    packages+=(gnutls-bin gupnp-tools golang-go golang-github-hashicorp-yamux-dev dbus curl iproute2 strace
               python3 python3-venv python3-dbus
               qemu-system-x86 linux-image-amd64 bluez bluez-test-tools busybox-static cpio kmod xz-utils zstd
               chromium stunnel4 openssh-server openssh-client)
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
    echo "bootstrap: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
    # A freshly installed openssh-server must not leave a system sshd running: the bench starts its own.
    if [[ " ${missing[*]} " == *" openssh-server "* ]]; then
        if command -v systemctl >/dev/null; then systemctl disable --now ssh >/dev/null 2>&1 || true; fi
        if command -v service >/dev/null; then service ssh stop >/dev/null 2>&1 || true; fi
    fi
fi

if [[ "${1:-}" == "--test" ]]; then
    # Debian's python3 (not a pyenv one): python-dbusmock needs the system's python3-dbus.
    venv=.venv-test
    if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import dbusmock, async_upnp_client' 2>/dev/null; then
        echo "bootstrap: preparing $venv"
        /usr/bin/python3 -m venv --system-site-packages "$venv"
        "$venv/bin/pip" install -q python-dbusmock async-upnp-client
    fi
fi
