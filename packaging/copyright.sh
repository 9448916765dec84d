#!/usr/bin/env bash
# Prints /usr/share/doc/thali-node/copyright: the licenses of what is linked into the binary — the Swift
# runtime and the package's resolved dependencies (.build/checkouts; the documentation plugin and its
# symbol kit are not linked). Apache-2.0 texts are referenced in /usr/share/common-licenses, as Debian
# does; any other license's text is included whole. Run from the repository root after a build.
set -euo pipefail

echo "thali-node: the command-line Thali peer, built from the thali-swift repository."
echo "The repository carries no license file of its own; the components linked into"
echo "/usr/bin/thali-node and their licenses follow."
echo

swift_license=$(dirname "$(command -v swiftc)")/../share/swift/LICENSE.txt
echo "The Swift runtime and standard libraries (linked statically)"
echo "  Copyright (c) Apple Inc. and the Swift project authors"
echo "  License: Apache-2.0 with the Runtime Library Exception;"
echo "  see /usr/share/common-licenses/Apache-2.0."
if [[ -f "$swift_license" ]]; then
    sed -n '/Runtime Library Exception/,$p' "$swift_license" | sed 's/^/  /'
fi
echo

for checkout in .build/checkouts/*/; do
    name=$(basename "$checkout")
    [[ "$name" == swift-docc-* ]] && continue
    license=$(find "$checkout" -maxdepth 1 -iname 'LICENSE*' | sort | head -1)
    if [[ -z "$license" ]]; then
        echo "package: no license file in $checkout" >&2
        exit 1
    fi
    echo "$name"
    if grep -q "Apache License" "$license" && grep -q "Version 2.0" "$license"; then
        echo "  License: Apache-2.0; see /usr/share/common-licenses/Apache-2.0."
        if [[ -d "$checkout/Sources/CCryptoBoringSSL" ]]; then
            echo "  It embeds BoringSSL: ISC license, parts under the OpenSSL license (OpenSSL 3: Apache-2.0)."
        fi
    else
        sed 's/^/  /; s/^  $/  ./' "$license"
    fi
    echo
done
