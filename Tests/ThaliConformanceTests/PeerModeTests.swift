import Foundation
import NIOPosix
import Testing
import ThaliBeacons
import ThaliSSDP
import ThaliNodeTestSupport
import ThaliTestSupport

#if canImport(FoundationXML)
import FoundationXML
#endif

@testable import ThaliConformance

/// `thali-node conformance peer` against a real `thali-node run` on loopback, and peer mode's negative
/// cases against broken `openssl s_server` targets.
@Suite("Conformance peer mode", .serialized, .enabled(if: TestEnvironment.available(PackagePaths.thaliNode() != nil)))
struct PeerModeTests {
    static func node() throws -> String { try #require(PackagePaths.thaliNode()) }

    /// A fresh data directory with an identity; returns its path and public key.
    static func home(_ label: String) throws -> (path: String, key: String) {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("thali-conf-\(label)-\(UUID().uuidString)").path
        let created = try ChildProcess.run(try node(), ["--home", path, "identity", "create", "--json"], timeout: .seconds(20))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(created.output.utf8)) as? [String: Any], "\(created.output)")
        return (path, try #require(object["public_key"] as? String))
    }

    /// A `thali-node run` on loopback with the suite as its contact, and the suite's own data directory.
    struct Implementation {
        let iut: String, iutKey: String, suite: String, ssdpPort: Int
        let peer: RunningPeer

        /// Stops the node and deletes both directories.
        func remove() {
            _ = peer.kill(signal: SIGTERM)
            try? FileManager.default.removeItem(atPath: iut)
            try? FileManager.default.removeItem(atPath: suite)
        }
    }

    /// The data directories of an implementation not started yet: its own, with the suite as a contact,
    /// and the suite's; and its SSDP port.
    struct PreparedImplementation {
        let iut: String, iutKey: String, suite: String, ssdpPort: Int

        /// Starts `thali-node run` (`environment` added to its own) and waits for `started`.
        func start(environment: [String: String]? = nil) async throws -> Implementation {
            let peer = try RunningPeer("iut", try PeerModeTests.node(), ["run", "--home", iut, "--address", "127.0.0.1", "--ssdp-port",
                                                                        String(ssdpPort), "--json", "--max-age", "5"], environment: environment)
            try await peer.waitFor("started") { $0.isStarted }
            return Implementation(iut: iut, iutKey: iutKey, suite: suite, ssdpPort: ssdpPort, peer: peer)
        }
    }

    /// Creates the implementation's and the suite's data directories.
    static func prepareImplementation() throws -> PreparedImplementation {
        let (iut, iutKey) = try home("iut")
        let (suite, suiteKey) = try home("suite")
        _ = try ChildProcess.run(try node(), ["--home", iut, "contacts", "add", "conformance", suiteKey], timeout: .seconds(20))
        return PreparedImplementation(iut: iut, iutKey: iutKey, suite: suite, ssdpPort: Int.random(in: 20_000...40_000))
    }

    /// Starts the implementation under test (`environment` added to its own) and waits for `started`.
    static func startImplementation(environment: [String: String]? = nil) async throws -> Implementation {
        try await prepareImplementation().start(environment: environment)
    }

    @Test("against thali-node run: every MUST and SHOULD case passes, in both roles; JSON and JUnit outputs parse")
    func againstOurNode() async throws {
        let node = try Self.node()
        let implementation = try await Self.startImplementation()
        defer { implementation.remove() }
        let (iut, iutKey, suite, ssdpPort, peer) = (implementation.iut, implementation.iutKey, implementation.suite,
                                                    implementation.ssdpPort, implementation.peer)

        let jsonPath = suite + "/report.json", junitPath = suite + "/report.xml"
        let started = ContinuousClock.now
        let run = try ChildProcess(node, ["conformance", "peer", "--peer-key", iutKey, "--identity", suite + "/identity.key",
                                          "--address", "127.0.0.1", "--ssdp-port", String(ssdpPort),
                                          "--adapter", "\(node) --home \(iut)", "--json-out", jsonPath, "--junit-out", junitPath])
        let status = try await run.waitForExit(timeout: .seconds(90))
        try? await run.waitForOutput(containing: "conform", timeout: .seconds(2))
        print("conformance peer against thali-node run took \(ContinuousClock.now - started)")
        #expect(status == 0, "\(run.output)\n--- node:\n\(peer.output)")

        let object = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: jsonPath))) as? [String: Any])
        #expect(object["format"] as? String == ConformanceReport.format)
        #expect(object["baseline_mismatches"] as? [Any] != nil && object["catalog_version"] as? Int != nil, "snake_case keys: \(object.keys)")
        let results = try #require(object["results"] as? [[String: Any]])
        let ids = Set(results.compactMap { $0["id"] as? String })
        #expect(ids == Set(PeerConformance.Cases.all.map(\.id)), "every case reports once")
        for result in results where ["MUST", "SHOULD"].contains(result["level"] as? String) {
            #expect(result["verdict"] as? String == "PASS", "\(result)\n\(run.output)")
        }
        // A second announcement came (the node announces anew for an item queued during the run), each under a key of its own.
        let keys = results.first { $0["id"] as? String == PeerConformance.Cases.freshEphemeralKey.id }?["actual"] as? String
        #expect(keys?.hasSuffix("different ephemeral keys") == true, "\(keys ?? "no result")")
        // Progress lines came before the table, one per case.
        #expect(run.output.split(separator: "\n").filter { $0.hasPrefix("PASS ") }.count >= results.count - 1, "\(run.output)")

        let parser = XMLParser(data: try Data(contentsOf: URL(fileURLWithPath: junitPath)))
        let counter = ElementCounter()
        parser.delegate = counter
        #expect(parser.parse())
        #expect(counter.counts["testcase"] == results.count)
        #expect(counter.counts["failure"] == nil)

        // The suite delivered three items to the node, once each: one by offer, and the intact first and
        // third of its batch (the damaged second was rejected, the expired offer refused).
        let inbox = try ChildProcess.run(node, ["--home", iut, "inbox", "--json"], timeout: .seconds(20))
        let items = try #require(try JSONSerialization.jsonObject(with: Data(inbox.output.utf8)) as? [[String: Any]])
        let texts = items.compactMap { $0["text"] as? String }.map { $0.split(separator: " ").dropLast().joined(separator: " ") }
        #expect(texts.sorted() == ["thali-conformance batch item 1", "thali-conformance batch item 3", "thali-conformance sender test"], "\(items)")
        #expect(peer.kill(signal: SIGTERM) == 0)
    }

    @Test("SIGINT mid-run prints the cases that ended, marked interrupted, and exits 130")
    func interrupted() async throws {
        let (suite, _) = try Self.home("sigint")
        defer { try? FileManager.default.removeItem(atPath: suite) }
        // A location nobody answers at: the run waits there for the whole discovery timeout.
        let run = try ChildProcess(try Self.node(), [
            "conformance", "peer", "--peer-key", PrivateKey().publicKey.hexString(compressed: true),
            "--identity", suite + "/identity.key", "--ssdp-port", String(Int.random(in: 20_000...40_000)),
            "--location", "http://127.0.0.1:9", "--discovery-timeout-s", "60",
        ])
        try await run.waitForOutput(containing: "peer/ssdp/discovered", timeout: .seconds(20))
        let status = run.terminate(signal: SIGINT, grace: .seconds(10))
        try? await run.waitForOutput(containing: "conform", timeout: .seconds(2))
        #expect(status == 130, "\(run.output)")
        #expect(run.output.contains("(interrupted)"), "\(run.output)")
        #expect(run.output.contains("N/A          MUST    peer/ssdp/discovered"), "the progress line: \(run.output)")
        #expect(run.output.split(separator: "\n").last?.hasPrefix("1 PASS") == false, "\(run.output)")
    }

    /// Runs peer mode (negative cases only: nothing there serves beacons) against `host:port`.
    static func gradeBroken(port: Int) async throws -> ConformanceReport {
        var configuration = PeerConformanceConfiguration(peerKey: PrivateKey().publicKey, identity: PrivateKey(), address: "127.0.0.1")
        configuration.location = BeaconLocation(host: "127.0.0.1", port: port)
        configuration.ssdpPort = Int.random(in: 20_000...40_000)
        configuration.discoveryTimeout = .seconds(1)
        configuration.stepTimeout = .seconds(5)
        configuration.senderRole = false
        let run = ConformanceRun(target: "broken", catalog: try RequirementCatalog.load(from: RequirementCatalog.defaultPath))
        await PeerConformance(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton).run(run)
        return run.report
    }

    static func acceptPort(_ server: ChildProcess) async throws -> Int {
        try await server.waitForOutput(containing: "ACCEPT")
        let line = try #require(server.output.split(separator: "\n").first { $0.hasPrefix("ACCEPT") })
        return try #require(Int(line.split(separator: ":").last ?? ""))
    }

    /// A new empty directory for one test's files.
    static func scratchDirectory(_ label: String) throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-conf-\(label)-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return directory
    }

    static func openssl(_ arguments: [String]) async throws {
        let tool = try ChildProcess("openssl", arguments)
        #expect(try await tool.waitForExit() == 0, "openssl \(arguments): \(tool.output)")
    }

    @Test("an openssl s_server with a 1536-bit group: dh-group-size and no-session-tickets FAIL, the unknown identity only WARNs",
          .enabled(if: TestEnvironment.available(ChildProcess.which("openssl") != nil)))
    func smallGroupServer() async throws {
        let directory = try Self.scratchDirectory("dh")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await Self.openssl(["genpkey", "-genparam", "-algorithm", "DH", "-pkeyopt", "group:modp_1536", "-out", directory + "/dh.pem"])
        let server = try ChildProcess("openssl", [
            "s_server", "-accept", "127.0.0.1:0", "-nocert", "-tls1_2", "-psk", "0102030405060708090a0b0c0d0e0f10",
            "-psk_identity", "someone-else", "-cipher", "DHE-PSK-AES256-GCM-SHA384:@SECLEVEL=0", "-dhparam", directory + "/dh.pem",
        ])
        defer { _ = server.terminate() }
        let report = try await Self.gradeBroken(port: try await Self.acceptPort(server))
        #expect(report.result("peer/psk-tls/dh-group-size")?.verdict == .fail, "\(report.table)")
        #expect(report.result("peer/psk-tls/dh-group-size")?.actual == "1536 bits")
        #expect(report.result("peer/psk-tls/dh-fresh")?.verdict == .pass, "\(report.table)")
        #expect(report.result("peer/psk-tls/no-identity-hint")?.verdict == .pass, "\(report.table)")
        #expect(report.result("peer/psk-tls/no-compression")?.verdict == .pass, "\(report.table)")
        // s_server issues session tickets unless told -no_ticket: resumption would skip the PSK lookup.
        #expect(report.result("peer/psk-tls/no-session-tickets")?.verdict == .fail, "\(report.table)")
        #expect(report.result("peer/psk-tls/tls13-refused")?.verdict == .pass, "\(report.table)")
        #expect(report.result("peer/psk-tls/other-suites-refused")?.verdict == .pass, "\(report.table)")
        // Our client refuses the small group before the identity matters: refused, but not as specified.
        let unknown = try #require(report.result("peer/psk-tls/unknown-identity"))
        #expect(unknown.verdict == .warn && unknown.actual.contains("dh key too small"), "\(report.table)")
        #expect(report.result("peer/beacons/match")?.verdict == .inconclusive)
        // Without a beacon match nothing behind the beacon is graded: not the marking cases, not the raw yamux ones.
        for id in ["peer/streams/unmarked-served", "peer/streams/alpn-selected", "peer/streams/bad-header-refused",
                   "peer/streams/delivery-accepted", "peer/yamux/goaway-normal"] {
            #expect(report.result(id)?.verdict == .inconclusive, "\(id)\n\(report.table)")
        }
        #expect(!report.succeeded)
    }

    @Test("a TLS 1.3-only openssl s_server: tls13-refused and dh-group-size FAIL",
          .enabled(if: TestEnvironment.available(ChildProcess.which("openssl") != nil)))
    func tls13OnlyServer() async throws {
        let directory = try Self.scratchDirectory("13")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await Self.openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
                                "-subj", "/CN=conformance", "-keyout", directory + "/key.pem", "-out", directory + "/cert.pem"])
        let server = try ChildProcess("openssl", [
            "s_server", "-accept", "127.0.0.1:0", "-tls1_3", "-cert", directory + "/cert.pem", "-key", directory + "/key.pem",
        ])
        defer { _ = server.terminate() }
        let report = try await Self.gradeBroken(port: try await Self.acceptPort(server))
        let tls13 = try #require(report.result("peer/psk-tls/tls13-refused"))
        #expect(tls13.verdict == .fail && tls13.actual.hasPrefix("ServerHello"), "\(report.table)")
        #expect(report.result("peer/psk-tls/dh-group-size")?.verdict == .fail, "\(report.table)")
        #expect(report.unexpectedMustFailures.map(\.testCase.id).contains("peer/psk-tls/tls13-refused"))
        #expect(!report.succeeded)
    }
}
