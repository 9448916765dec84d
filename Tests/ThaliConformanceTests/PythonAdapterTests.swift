import Foundation
import Testing
import ThaliNodeTestSupport
import ThaliTestSupport

@testable import ThaliConformance

/// The reference adapter of the quick start (`conformance/adapters/python/thali_adapter.py`, standard
/// library only), written from the adapter contract alone, driving `thali-node` as the implementation
/// under test in peer mode.
@Suite("The reference Python adapter", .serialized,
       .enabled(if: TestEnvironment.available(PackagePaths.thaliNode() != nil && ChildProcess.which("python3") != nil)))
struct PythonAdapterTests {
    static let adapter = PackagePaths.root() + "/conformance/adapters/python/thali_adapter.py"

    @Test("conformance peer through the Python adapter against thali-node run: every MUST passes, every verb is used")
    func everyMustPasses() async throws {
        let node = try #require(PackagePaths.thaliNode())
        // The implementation does not know the suite yet: the adapter's `contacts add` (--add-contact) tells it.
        let (iut, iutKey) = try PeerModeTests.home("py-iut")
        let (suite, _) = try PeerModeTests.home("py-suite")
        let ssdpPort = Int.random(in: 20_000...40_000)
        let peer = try RunningPeer("iut", node, ["run", "--home", iut, "--address", "127.0.0.1", "--ssdp-port", String(ssdpPort),
                                                 "--json", "--max-age", "5"])
        defer {
            _ = peer.kill(signal: SIGTERM)
            try? FileManager.default.removeItem(atPath: iut)
            try? FileManager.default.removeItem(atPath: suite)
        }
        try await peer.waitFor("started") { $0.isStarted }

        let jsonPath = suite + "/report.json"
        let run = try ChildProcess(node, [
            "conformance", "peer", "--peer-key", iutKey, "--identity", suite + "/identity.key", "--address", "127.0.0.1",
            "--ssdp-port", String(ssdpPort), "--add-contact", "--json-out", jsonPath,
            "--adapter", "python3 \(Self.adapter) --node \(node) --home \(iut)",
        ])
        let status = try await run.waitForExit(timeout: .seconds(120))
        try? await run.waitForOutput(containing: "conform", timeout: .seconds(2))
        #expect(status == 0, "\(run.output)\n--- node:\n\(peer.output)")

        let report = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: jsonPath))) as? [String: Any])
        let results = try #require(report["results"] as? [[String: Any]])
        #expect(Set(results.compactMap { $0["id"] as? String }) == Set(PeerConformance.Cases.all.map(\.id)))
        let musts = results.filter { $0["level"] as? String == "MUST" }
        #expect(!musts.isEmpty)
        for result in musts {
            #expect(result["verdict"] as? String == "PASS", "\(result)\n\(run.output)")
        }
        // The cases that need each verb were graded, not skipped: `contacts add` and `send` (the receiver
        // role found items queued for us), `inbox` (what the suite delivered), `events` (the implementation's
        // own reports of an unclean close and of the peers it found).
        let verdicts = Dictionary(results.compactMap { result in (result["id"] as? String).map { ($0, result["verdict"] as? String) } },
                                  uniquingKeysWith: { first, _ in first })
        for id in [PeerConformance.Cases.senderInbox.id, PeerConformance.Cases.uncleanCloseReported.id,
                   PeerConformance.Cases.ownAlivesDropped.id, PeerConformance.Cases.sendWindowRespected.id, "peer/delivery/partial-resumed"] {
            #expect(verdicts[id] == "PASS", "\(id): \(verdicts[id] ?? "missing")\n\(run.output)")
        }
        #expect(!run.output.contains("adapter:"), "no adapter call failed: \(run.output)")
        let contacts = try ChildProcess.run(node, ["--home", iut, "contacts", "list", "--json"], timeout: .seconds(20))
        #expect(contacts.output.contains("\"conformance\""), "the adapter added the suite: \(contacts.output)")
    }
}
