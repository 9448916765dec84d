#!/usr/bin/env bash
# The Debian package as a user meets it, in the test command after `swift build --build-tests`: packages the
# debug build of thali-node, relinked with the Swift runtime inside (scripts/package.sh --configuration debug),
# installs the .deb with dpkg -i into a fresh Debian 12 root (minbase, plus only what the package's Depends
# names), runs `thali-node --version`, `identity create` and a short `run` there as the `thali` user,
# checks the systemd unit with the root's `systemd-analyze verify` and every manual page with man's warnings, then
# removes the package (data kept) and purges it (nothing left). Ends with one line: passed or FAILED.
#
# The root: debootstrap --variant=minbase from the host's own Debian mirror, made once into
# .build-debroot/bookworm (git-ignored; a few minutes) and mounted per run as the lower layer of an
# overlay, so each run starts from the same untouched root; the Debian packages its Depends pull in are
# cached in .build-debroot/archives. Needs root (chroot, mounts). Usage: scripts/package-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# MARK: inside a private mount namespace (the second half of this script, below, re-executes it here)
if [[ "${1:-}" == --in-namespace ]]; then
    deb=$2 lower=$3 archives=$4 work=$5 expected_version=$6
    fail() { echo "package-test: $*" >&2; exit 1; }
    root=$work/root
    mkdir -p "$work/upper" "$work/overlay-work" "$root"
    mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/overlay-work" "$root"
    mount -t proc proc "$root/proc"
    mount --bind "$archives" "$root/var/cache/apt/archives"
    in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
    as_thali() { in_root setpriv --reuid=thali --regid=thali --init-groups /usr/bin/env HOME=/var/lib/thali "$@"; }

    # What the package says it depends on, from Debian, and nothing more; then the package itself.
    depends=$(dpkg-deb -f "$deb" Depends)
    in_root apt-get satisfy -qq -y --no-install-recommends "$depends" >"$work/apt.log" 2>&1 \
        || { cat "$work/apt.log"; fail "apt-get satisfy '$depends' failed"; }
    cp "$deb" "$root/tmp/thali-node.deb"
    in_root dpkg -i /tmp/thali-node.deb >/dev/null || fail "dpkg -i failed"
    in_root dpkg -s thali-node | grep -q '^Status: install ok installed$' || fail "dpkg -s: not installed"
    files=$(in_root dpkg -L thali-node)

    # The thali user and its private data directory.
    passwd=$(in_root getent passwd thali) || fail "postinst made no thali user"
    [[ "$passwd" == thali:x:*:*:*:/var/lib/thali:/usr/sbin/nologin ]] || fail "thali user: $passwd"
    mode=$(in_root stat -c '%U:%G %a' /var/lib/thali)
    [[ "$mode" == "thali:thali 700" ]] || fail "/var/lib/thali is $mode"

    # The binary runs there as the thali user, with only Debian's libraries.
    version=$(as_thali thali-node --version) || fail "thali-node --version failed: $version"
    [[ "$version" == "$expected_version" ]] || fail "--version in the root: '$version', built: '$expected_version'"
    as_thali thali-node identity create --home /var/lib/thali >/dev/null || fail "identity create failed"
    [[ "$(in_root stat -c '%U %a' /var/lib/thali/identity.key)" == "thali 600" ]] || fail "identity.key not thali's, 0600"
    shown=$(as_thali thali-node identity show --json --home /var/lib/thali) || fail "identity show failed"
    [[ "$shown" == *'"public_key"'* ]] || fail "identity show: $shown"
    # What the unit runs, briefly, on loopback (an SSDP port of its own: other tests may be on the default).
    ran=$(as_thali thali-node run --home /var/lib/thali --address 127.0.0.1 --ssdp-port $((20000 + RANDOM % 20000)) \
        --duration 2 2>&1) || fail "thali-node run failed: $ran"
    [[ "$ran" == *"listening at http://127.0.0.1:"*"stopped (duration)"* ]] || fail "thali-node run: $ran"
    in_root bash -n /usr/share/bash-completion/completions/thali-node || fail "bash completion does not parse"

    # The unit, checked by the root's own systemd (installed now, after the package: the package does not
    # need it): every setting parses, the binary it starts exists, the targets it names are there.
    # --man=no: man-db is not in the root; the pages are checked below.
    in_root apt-get install -qq -y --no-install-recommends systemd >"$work/apt.log" 2>&1 \
        || { cat "$work/apt.log"; fail "apt-get install systemd failed"; }
    verify=$(in_root systemd-analyze verify --man=no thali-node.service 2>&1) || fail "systemd-analyze verify: $verify"
    [[ -z "$verify" ]] || fail "systemd-analyze verify warns: $verify"
    mkdir -p "$root/etc/systemd/system/thali-node.service.d"
    cp "$root/usr/share/doc/thali-node/examples/bluetooth.conf" "$root/etc/systemd/system/thali-node.service.d/"
    verify=$(in_root systemd-analyze verify --man=no thali-node.service 2>&1) || fail "verify with bluetooth.conf: $verify"
    [[ -z "$verify" ]] || fail "systemd-analyze verify with bluetooth.conf warns: $verify"
    rm -r "$root/etc/systemd/system/thali-node.service.d"
    in_root systemd-analyze security --offline=yes thali-node.service > "$work/security.txt" 2>&1 || true
    echo "package-test: systemd-analyze security: $(tail -n 1 "$work/security.txt" | sed 's/^→ //')"

    # A manual page per command, each rendering without a warning.
    for command in thali-node thali-node-run thali-node-identity-create thali-node-contacts-add; do
        grep -qx "/usr/share/man/man1/$command.1.gz" <<<"$files" || fail "no manual page $command(1)"
    done
    while read -r page; do
        warnings=$(MANWIDTH=80 man --warnings -l "$root$page" 2>&1 >/dev/null) || fail "man $page failed"
        [[ -z "$warnings" ]] || fail "man $page: $warnings"
    done < <(grep '\.1\.gz$' <<<"$files")

    # remove: the package's files go, the node's data and the conffile stay.
    in_root dpkg -r thali-node >/dev/null || fail "dpkg -r failed"
    in_root dpkg -s thali-node | grep -q '^Status: deinstall ok config-files$' || fail "after dpkg -r: not config-files"
    [[ -f "$root/var/lib/thali/identity.key" ]] || fail "dpkg -r deleted the node's identity"
    [[ -f "$root/etc/default/thali-node" ]] || fail "dpkg -r deleted the conffile"
    [[ ! -e "$root/usr/bin/thali-node" ]] || fail "dpkg -r left /usr/bin/thali-node"

    # purge: nothing of the package is left; the thali system user stays, as Debian leaves system users.
    in_root dpkg -P thali-node >/dev/null || fail "dpkg -P failed"
    if in_root dpkg -s thali-node >/dev/null 2>&1; then fail "dpkg -s still knows thali-node after a purge"; fi
    left=()
    while read -r path; do
        [[ -d "$root$path" ]] && continue     # shared directories such as /usr/bin (and /lib, a link to usr/lib)
        [[ -e "$root$path" || -L "$root$path" ]] && left+=("$path")
    done <<<"$files"
    (( ${#left[@]} == 0 )) || fail "dpkg -P left ${left[*]}"
    for directory in /var/lib/thali /usr/share/doc/thali-node /etc/default/thali-node; do
        [[ ! -e "$root$directory" ]] || fail "dpkg -P left $directory"
    done
    in_root getent passwd thali >/dev/null || fail "the purge deleted the thali user"
    exit 0
fi

# MARK: on the host
started=$SECONDS
scripts/bootstrap.sh --test >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
result() { echo "package-test: FAILED ($((SECONDS - started)) s): $*"; }
trap 'status=$?; if (( status )); then result "exit $status; see the lines above"; fi; rm -rf "$work"' EXIT

# The package of the debug build, relinked statically (package.sh links the dynamic one back after).
scripts/package.sh --configuration debug --quick --output "$work" >"$work/package.log" 2>&1 \
    || { tail -n 20 "$work/package.log"; exit 1; }
deb=$(tail -n 1 "$work/package.log")
echo "package-test: packaged ($((SECONDS - started)) s)"
expected_version=$(.build/debug/thali-node --version)

# The fresh root, made once from the mirror this machine's apt uses.
cache=.build-debroot
if [[ ! -f "$cache/bookworm/.complete" ]]; then
    mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null | awk '$2 == "bookworm" {print $1; exit}')
    echo "package-test: making a fresh Debian 12 root in $cache/bookworm (debootstrap --variant=minbase)"
    rm -rf "$cache/bookworm"
    mkdir -p "$cache"
    debootstrap --variant=minbase bookworm "$cache/bookworm" ${mirror:+"$mirror"} >"$work/debootstrap.log" 2>&1 \
        || { tail -n 20 "$work/debootstrap.log"; exit 1; }
    chroot "$cache/bookworm" apt-get clean
    touch "$cache/bookworm/.complete"
fi
mkdir -p "$cache/archives/partial"

unshare --mount --propagation private "$0" --in-namespace "$deb" "$PWD/$cache/bookworm" "$PWD/$cache/archives" \
    "$work" "$expected_version"

depends=$(dpkg-deb -f "$deb" Depends)
echo "package-test: passed ($((SECONDS - started)) s): $(basename "$deb"), $(du -k "$deb" | cut -f1) KiB, Depends: $depends"
