import Foundation
import Testing
import ThaliTestSupport

/// The examples in `Examples/` are built with the package (`swift build --build-tests`) and run here, so
/// an API change that breaks them fails the tests, and so does an example that stops doing what it shows.
@Suite("Examples", .serialized)
struct ExamplesTests {
    /// Runs the example executable `name` to completion and returns its exit status and output.
    private func run(_ name: String, timeout: Duration = .seconds(90)) async throws -> (status: Int32, output: String) {
        let path = try #require(PackagePaths.builtExecutable(name), "\(name) is not built; run swift build --build-tests")
        let child = try ChildProcess(path, [])
        let status = try await child.waitForExit(timeout: timeout)
        return (status, child.output)
    }

    @Test("beacon-round-trip: the target matches, both sides hold the same PSK, a stranger does not match")
    func beaconRoundTrip() async throws {
        let (status, output) = try await run("beacon-round-trip")
        #expect(status == 0, "\(output)")
        #expect(output.contains("bob found beacon #1 from alice"))
        #expect(output.contains("alice's table holds the same 16-byte PSK for bob: true"))
        #expect(output.contains("mallory: no-match"))
    }

    @Test("psk-tls-echo: a PSK-TLS 1.2 session echoes the client's message")
    func pskTLSEcho() async throws {
        let (status, output) = try await run("psk-tls-echo")
        #expect(status == 0, "\(output)")
        #expect(output.contains("connected: TLSv1.2 DHE-PSK-AES256-GCM-SHA384"))
        #expect(output.contains("echoed: hello over PSK-TLS"))
    }

    @Test("yamux-bridge: four connections share one link and each gets its own answer")
    func yamuxBridge() async throws {
        let (status, output) = try await run("yamux-bridge")
        #expect(status == 0, "\(output)")
        for word in ["alpha", "bravo", "charlie", "delta"] {
            #expect(output.contains("\(word) -> \(word.uppercased())"))
        }
        #expect(output.contains("streams opened over the one link: 4"))
    }

    @Test("embedded-peer: an app's peer delivers a text that the other app sees in its event stream and inbox, then the apps talk over an app stream")
    func embeddedPeer() async throws {
        let (status, output) = try await run("embedded-peer")
        #expect(status == 0, "\(output)")
        #expect(output.contains("bob's app: alice delivered item"))
        #expect(output.contains("bob's inbox: \"hello from an embedded peer\""))
        #expect(output.contains("bob's app answered alice's stream: \"HELLO OVER AN APP STREAM\""))
    }

    /// The app API of ThaliNodeCore takes and returns Swift and Foundation types: the embedded-peer
    /// example, which uses the peer, its events and app streams, is built (above) without any NIO module.
    @Test("embedded-peer imports no NIO module, and its target depends on none")
    func embeddedPeerNeedsNoNIO() throws {
        let root = PackagePaths.root()
        let sources = try FileManager.default.contentsOfDirectory(atPath: root + "/Examples/EmbeddedPeer")
            .filter { $0.hasSuffix(".swift") }
        #expect(!sources.isEmpty)
        for file in sources {
            let text = try String(contentsOfFile: root + "/Examples/EmbeddedPeer/" + file, encoding: .utf8)
            let imports = text.split(separator: "\n").filter { $0.hasPrefix("import ") }
            #expect(!imports.isEmpty)
            #expect(!imports.contains { $0.contains("NIO") }, "\(file): \(imports)")
        }
        let manifest = try String(contentsOfFile: root + "/Package.swift", encoding: .utf8)
        let start = try #require(manifest.range(of: "name: \"embedded-peer\""))
        let end = try #require(manifest.range(of: "path: \"Examples/EmbeddedPeer\"", range: start.upperBound..<manifest.endIndex))
        let dependencies = manifest[start.upperBound..<end.lowerBound]
        #expect(!dependencies.contains("swift-nio"), "\(dependencies)")
    }
}
