#!/usr/bin/env bash
# Builds the Debian package of thali-node: the binary with the Swift runtime linked in (depending only on
# Debian's libraries), a manual page per command, bash/zsh/fish completions and a hardened systemd unit.
#
#   scripts/package.sh                  release build (swift build -c release --static-swift-stdlib, in
#                                       .build-static), then
#                                       the package in .build-package/thali-node_VERSION_ARCH.deb
#   --configuration debug               the debug build in .build instead, relinked (the test's)
#   --binary PATH                       package an already built thali-node instead of building one
#   --output DIR                        where the .deb goes (default .build-package)
#   --quick                             gzip -1 instead of xz -6 (the test's large debug binary)
#
# The version is the binary's own (`thali-node --version`, set in Sources/thali-node/Version.swift), so
# the package cannot disagree with what it holds. Prints the .deb's path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=""
configuration=release
output=.build-package
compression=(-Zxz)
while (( $# )); do
    case "$1" in
        --binary) binary=$2; shift 2 ;;
        --configuration) configuration=$2; shift 2 ;;
        --output) output=$2; shift 2 ;;
        --quick) compression=(-Zgzip -z1); shift ;;
        *) echo "usage: scripts/package.sh [--configuration release|debug | --binary PATH] [--output DIR] [--quick]" >&2; exit 64 ;;
    esac
done

if [[ "$configuration" != release && "$configuration" != debug ]]; then
    echo "package: --configuration is release or debug, not '$configuration'" >&2
    exit 64
fi

scripts/bootstrap.sh --package
swift package resolve >/dev/null     # .build/checkouts: the manual tool's source, the licenses

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The Swift runtime linked in changes what each object file asks the linker for (the static Foundation's own
# libraries), and SwiftPM does not recompile when only that changes: static and dynamic builds must not
# share objects they compiled. The release build has its own scratch directory, .build-static.
if [[ -z "$binary" && "$configuration" == release ]]; then
    swift build -c release --static-swift-stdlib --scratch-path .build-static --product thali-node
    binary=$(swift build -c release --scratch-path .build-static --show-bin-path)/thali-node
elif [[ -z "$binary" ]]; then
    # The debug build (the test's) shares .build with the ordinary build, whose objects are compiled for
    # dynamic linking: they are brought up to date that way first, so that the static link only relinks them,
    # naming the static Foundation's libraries they leave out (as a group: their order is free); then the
    # dynamic binary is linked back, and .build is as an ordinary build leaves it.
    swift build --product thali-node
    static_libraries=(-Xlinker --start-group)
    for library in Foundation CoreFoundation FoundationInternationalization FoundationEssentials _FoundationICU \
        _FoundationCShims _FoundationCollections swiftCore; do
        static_libraries+=(-Xlinker "-l$library")
    done
    static_libraries+=(-Xlinker --end-group)
    swift build --static-swift-stdlib --product thali-node "${static_libraries[@]}"
    cp "$(swift build --show-bin-path)/thali-node" "$work/thali-node"
    binary=$work/thali-node
    swift build --product thali-node
fi
binary=$(realpath "$binary")

# The Swift runtime must be inside: a binary that needs libswiftCore.so does not run on a Debian system.
if objdump -p "$binary" | grep -qE 'NEEDED +libswift|NEEDED +libFoundation|NEEDED +lib_Foundation|NEEDED +libdispatch'; then
    echo "package: $binary links the Swift runtime dynamically; build it with --static-swift-stdlib" >&2
    exit 1
fi

version_line=$("$binary" --version | head -1)        # thali-node 0.1.0 (commit abcdef1)
version=$(awk '{print $2}' <<<"$version_line")
commit=$(sed -n 's/.*(commit \([^)]*\)).*/\1/p' <<<"$version_line")
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "package: cannot read a version from '$version_line'" >&2
    exit 1
fi
architecture=$(dpkg --print-architecture)
maintainer=${DEB_MAINTAINER:-$(git log -1 --format='%an <%ae>' 2>/dev/null || true)}
maintainer=${maintainer:-thali-node packager <root@localhost>}

stage=$work/root
install -d "$stage/DEBIAN" "$stage/usr/bin" "$stage/usr/share/man/man1" "$stage/lib/systemd/system" \
    "$stage/etc/default" "$stage/usr/share/doc/thali-node/examples" \
    "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
    "$stage/usr/share/fish/vendor_completions.d"

# The binary, stripped as Debian ships binaries.
install -m 0755 "$binary" "$stage/usr/bin/thali-node"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$stage/usr/bin/thali-node"

# A manual page per command, from the command definitions (swift-argument-parser's generate-manual).
packaging/manuals.sh "$stage/usr/bin/thali-node" "$work/man"
for page in "$work"/man/*.1; do
    gzip -9n <"$page" >"$stage/usr/share/man/man1/$(basename "$page").gz"
done

# Completions, from the same definitions.
"$binary" --generate-completion-script bash >"$stage/usr/share/bash-completion/completions/thali-node"
"$binary" --generate-completion-script zsh >"$stage/usr/share/zsh/vendor-completions/_thali-node"
"$binary" --generate-completion-script fish >"$stage/usr/share/fish/vendor_completions.d/thali-node.fish"

# The service, its options file, the Bluetooth drop-in, the documentation Debian asks for.
install -m 0644 packaging/thali-node.service "$stage/lib/systemd/system/thali-node.service"
install -m 0644 packaging/default "$stage/etc/default/thali-node"
install -m 0644 packaging/bluetooth.conf "$stage/usr/share/doc/thali-node/examples/bluetooth.conf"
packaging/copyright.sh >"$stage/usr/share/doc/thali-node/copyright"
{
    echo "thali-node ($version) unstable; urgency=medium"
    echo
    echo "  * Built from ${commit:+commit $commit of }the thali-swift repository."
    echo
    echo " -- $maintainer  $(date -R ${SOURCE_DATE_EPOCH:+-d @$SOURCE_DATE_EPOCH})"
} | gzip -9n >"$stage/usr/share/doc/thali-node/changelog.Debian.gz"

# Maintainer scripts.
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$stage/DEBIAN/"
install -m 0644 packaging/debian/conffiles "$stage/DEBIAN/"

# Depends: the Debian packages of the shared libraries the binary loads (dpkg-shlibdeps reads the
# symbols files of the installed library packages), and adduser for the postinst.
mkdir -p "$work/shlibs/debian"
printf 'Source: thali-node\n\nPackage: thali-node\nArchitecture: any\n' >"$work/shlibs/debian/control"
shlibs=$(cd "$work/shlibs" && dpkg-shlibdeps -O "$stage/usr/bin/thali-node" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
if [[ -z "$shlibs" ]]; then
    echo "package: dpkg-shlibdeps found no dependencies for $binary" >&2
    exit 1
fi
depends="adduser, $shlibs"

installed_size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@ARCHITECTURE@|$architecture|" -e "s|@MAINTAINER@|$maintainer|" \
    -e "s|@INSTALLED_SIZE@|$installed_size|" -e "s|@DEPENDS@|$depends|" packaging/debian/control.in \
    | if [[ -n "$commit" ]]; then sed "s|@COMMIT@|$commit|"; else sed '/^ \.$/{N;/@COMMIT@/d}'; fi \
    >"$stage/DEBIAN/control"
(cd "$stage" && find . \( -path ./DEBIAN -o -path ./etc \) -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) \
    >"$stage/DEBIAN/md5sums"

mkdir -p "$output"
deb=$(realpath "$output")/thali-node_${version}_${architecture}.deb
dpkg-deb --root-owner-group "${compression[@]}" --build "$stage" "$deb" >/dev/null
echo "package: thali-node $version${commit:+ (commit $commit)}, $(du -k "$deb" | cut -f1) KiB, Depends: $depends"
echo "$deb"
