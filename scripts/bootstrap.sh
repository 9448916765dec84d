#!/usr/bin/env bash
# Installs what the suite needs on Debian, idempotently. Usage: scripts/bootstrap.sh [--test]
#   (no flag)  build dependencies: the C libraries the system-library targets link against.
#   --test     also the independent peers the tests run: gssdp-discover, Go + hashicorp/yamux, dbus,
#              openssl, and a Python venv (.venv-test) with python-dbusmock and async-upnp-client.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(pkg-config libssl-dev libsecp256k1-dev libbluetooth-dev libdbus-1-dev openssl)
if [[ "${1:-}" == "--test" ]]; then
    packages+=(gupnp-tools golang-go golang-github-hashicorp-yamux-dev dbus python3 python3-venv python3-dbus iproute2)
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

# ThaliSSDP tests: curl is the independent HTTP client of /NotificationBeacons.
if [[ "${1:-}" == "--test" ]] && ! command -v curl >/dev/null; then
    echo "bootstrap: installing curl"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
fi

# ThaliPSKTLS tests: GnuTLS's gnutls-serv is a second, independent TLS stack for DHE-PSK interop.
if [[ "${1:-}" == "--test" ]] && ! command -v gnutls-serv >/dev/null; then
    echo "bootstrap: installing gnutls-bin"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq gnutls-bin >/dev/null
fi

# thali-node's store (GRDB) links the system SQLite: its headers come from libsqlite3-dev.
if ! dpkg-query -W -f='${Status}' libsqlite3-dev 2>/dev/null | grep -q "install ok installed"; then
    echo "bootstrap: installing libsqlite3-dev"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq libsqlite3-dev >/dev/null
fi
