import Foundation
import Testing
import ThaliTestSupport

/// An app whose peer uses Wi-Fi alone depends on ThaliNodeCore without ThaliNodeBluetooth, as
/// `embedded-peer` does, and so loads neither D-Bus nor BlueZ (issue 22); `thali-node`, which adds
/// Bluetooth, loads both.
@Suite("Linking the peer")
struct PeerLinkTests {
    /// The shared libraries the built executable `name` loads, as the dynamic linker resolves them.
    private func sharedLibraries(of name: String) async throws -> String {
        let path = try #require(PackagePaths.builtExecutable(name), "\(name) is not built; run swift build --build-tests")
        let child = try ChildProcess("/usr/bin/ldd", [path])
        let status = try await child.waitForExit(timeout: .seconds(30))
        try #require(status == 0, "ldd \(path): \(child.output)")
        return child.output
    }

    @Test("an app using Wi-Fi alone links neither libdbus nor libbluetooth; thali-node, with Bluetooth, links both")
    func aWiFiOnlyAppLinksNeitherDBusNorBlueZ() async throws {
        let embedded = try await sharedLibraries(of: "embedded-peer")
        #expect(!embedded.contains("libdbus-1"), "\(embedded)")
        #expect(!embedded.contains("libbluetooth"), "\(embedded)")
        let cli = try await sharedLibraries(of: "thali-node")
        #expect(cli.contains("libdbus-1") && cli.contains("libbluetooth"), "\(cli)")
    }
}
