import Foundation
import Testing
import ThaliNodeCore
import ThaliBLEBinding
import ThaliBluetoothTestSupport
import ThaliNodeTestSupport
@testable import ThaliConformance

/// `thali-node conformance peer --bluetooth` against a real `thali-node run --bluetooth hci0 --no-wifi`
/// (BlueZ played by python-dbusmock, the link by the cross-process stand-in, as in
/// `ConformanceBluetoothTests`): every case runs over one Bluetooth link, the SSDP ones N/A. And against
/// an address where nobody listens: the run ends in bounded time, nothing behind the link passes. Then
/// `thali-node conformance target --bluetooth`: each scripted peer on a link of its own, the SSDP cases N/A.
@Suite(.serialized, .timeLimit(.minutes(3)))
struct ConformanceModesOverBluetoothTests {
    /// Our node on the mock's hci0 with the stand-in of `scope`, the suite its contact "suite".
    struct Implementation {
        let people: TestPeople
        let node: RunningPeer
        let address: BluetoothAddress
        let environment: [String: String]
        let mock: BlueZMock

        var iut: TestPeople.Person { get throws { try people["iut"] } }
        var suite: TestPeople.Person { get throws { try people["suite"] } }

        static func start(label: String) async throws -> Implementation {
            let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
            let mock = try await BlueZMock()
            try await mock.addAdapter("hci0")
            let address = try await mock.address(of: "hci0")
            let people = try TestPeople(["iut", "suite"], label: label)
            let scope = "\(label)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let environment = ["DBUS_SYSTEM_BUS_ADDRESS": mock.busAddress, "THALI_BLUETOOTH_STANDIN": scope]
            let node = try RunningPeer("iut", executable, ["run", "--home", try people["iut"].home.path, "--json",
                                                           "--bluetooth", "hci0", "--no-wifi"], environment: environment)
            try await node.waitFor("started") { $0.isStarted }
            return Implementation(people: people, node: node, address: address, environment: environment, mock: mock)
        }

        /// The verdicts of a report written as JSON at `path`, by case id, with each result.
        static func results(at path: String) throws -> [String: [String: Any]] {
            let object = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any]
            let results = try #require(object?["results"] as? [[String: Any]])
            var byID: [String: [String: Any]] = [:]
            for result in results { if let id = result["id"] as? String { byID[id] = result } }
            return byID
        }
    }

    @Test("peer mode over one Bluetooth link to thali-node run: every MUST and SHOULD passes or is N/A, both roles pass",
          .enabled(if: BlueZMock.peersPresent))
    func peerModeAgainstOurNode() async throws {
        let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
        let implementation = try await Implementation.start(label: "bt-peer-mode")
        defer { _ = implementation.node.kill(signal: SIGTERM) }
        let (iut, suite) = (try implementation.iut, try implementation.suite)
        let jsonPath = suite.home.path + "/peer.json"
        let started = ContinuousClock.now
        let run = try ChildProcess(executable, [
            "conformance", "peer", "--bluetooth", implementation.address.description,
            "--peer-key", iut.publicKey, "--identity", suite.home.path + "/identity.key",
            "--adapter", "\(executable) --home \(iut.home.path)", "--name-at-peer", "suite", "--json-out", jsonPath,
        ], environment: implementation.environment)
        let status = try await run.waitForExit(timeout: .seconds(90))
        print("conformance peer over Bluetooth took \(ContinuousClock.now - started)")
        #expect(status == 0, "\(run.output)\n--- node:\n\(implementation.node.output.suffix(4000))")

        let results = try Implementation.results(at: jsonPath)
        #expect(Set(results.keys) == Set(PeerConformance.Cases.all.map(\.id)), "every case reports once")
        var warnings: [String] = []
        for (id, result) in results where ["MUST", "SHOULD"].contains(result["level"] as? String) {
            let verdict = result["verdict"] as? String
            #expect(verdict == "PASS" || verdict == "N/A", "\(id): \(result)\n\(run.output)")
        }
        for (id, result) in results where result["verdict"] as? String == "WARN" { warnings.append("\(id): \(result["actual"] ?? "")") }
        print("conformance peer over Bluetooth: WARN \(warnings.isEmpty ? "none" : warnings.joined(separator: "; "))")
        // Over the link: the SSDP cases do not apply, everything behind the link ran.
        let cases = PeerConformance.Cases.self
        for testCase in [cases.discovered, cases.usn, cases.searchAnswer, cases.searchAnswerDelay, cases.byebye, cases.multicastTTL,
                         cases.ownAlivesDropped] {
            #expect(results[testCase.id]?["verdict"] as? String == "N/A", "\(testCase.id)")
            #expect((results[testCase.id]?["actual"] as? String)?.contains("over Bluetooth") == true, "\(testCase.id)")
        }
        // It found the suite by the link's 00 hello and delivered over the link (the sender role), and the
        // suite received over the link (the receiver role).
        for testCase in PeerConformance.Cases.senderRole + PeerConformance.Cases.receiverRole
            + [cases.beaconFetch, cases.beaconMatch, cases.handshake, cases.closeNotify,
               cases.uncleanCloseReported, cases.sendWindowRespected] {
            #expect(results[testCase.id]?["verdict"] as? String == "PASS", "\(testCase.id): \(results[testCase.id] ?? [:])")
        }
        let texts = try iut.store.inbox().compactMap(\.text).map { $0.split(separator: " ").dropLast().joined(separator: " ") }
        #expect(texts.sorted() == ["thali-conformance batch item 1", "thali-conformance batch item 3", "thali-conformance sender test"])
    }

    @Test("peer mode over Bluetooth where nobody listens: bounded, and nothing behind the link passes")
    func peerModeAgainstNobody() async throws {
        let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
        let people = try TestPeople(["suite"], label: "bt-peer-nobody")
        let suite = try people["suite"]
        let jsonPath = suite.home.path + "/peer.json"
        let scope = "bt-peer-nobody-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let run = try ChildProcess(executable, [
            "conformance", "peer", "--bluetooth", "02:00:00:00:00:01", "--peer-key", randomPublicKey(),
            "--identity", suite.home.path + "/identity.key", "--json-out", jsonPath,
        ], environment: ["THALI_BLUETOOTH_STANDIN": scope])
        let status = try await run.waitForExit(timeout: .seconds(30))
        #expect(status != 0, "a MUST fails: \(run.output)")
        let results = try Implementation.results(at: jsonPath)
        let cases = PeerConformance.Cases.self
        #expect(results[cases.beaconFetch.id]?["verdict"] as? String == "FAIL", "\(run.output)")
        #expect(results[cases.discovered.id]?["verdict"] as? String == "N/A", "\(run.output)")
        for (id, result) in results where id != cases.discovered.id {
            #expect(result["verdict"] as? String != "PASS", "\(id)")
        }
    }

    @Test("target mode over Bluetooth links to thali-node run: every MUST and SHOULD passes or is N/A, the beacon cases pass",
          .enabled(if: BlueZMock.peersPresent))
    func targetModeAgainstOurNode() async throws {
        let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
        let implementation = try await Implementation.start(label: "bt-target-mode")
        defer { _ = implementation.node.kill(signal: SIGTERM) }
        let (iut, suite) = (try implementation.iut, try implementation.suite)
        let jsonPath = suite.home.path + "/target.json"
        let started = ContinuousClock.now
        let run = try ChildProcess(executable, [
            "conformance", "target", "--bluetooth", implementation.address.description,
            "--peer-key", iut.publicKey, "--identity", suite.home.path + "/identity.key", "--json-out", jsonPath,
        ], environment: implementation.environment)
        let status = try await run.waitForExit(timeout: .seconds(120))
        print("conformance target over Bluetooth took \(ContinuousClock.now - started)")
        #expect(status == 0, "\(run.output)\n--- node:\n\(implementation.node.output.suffix(4000))")

        let results = try Implementation.results(at: jsonPath)
        #expect(Set(results.keys) == Set(TargetConformance.casesOverBluetooth.map(\.id)), "every case reports once")
        for (id, result) in results where ["MUST", "SHOULD"].contains(result["level"] as? String) {
            let verdict = result["verdict"] as? String
            #expect(verdict == "PASS" || verdict == "N/A", "\(id): \(result)\n\(run.output)")
        }
        let warnings = results.filter { $0.value["verdict"] as? String == "WARN" }.map { "\($0.key): \($0.value["actual"] ?? "")" }
        print("conformance target over Bluetooth: WARN \(warnings.isEmpty ? "none" : warnings.joined(separator: "; "))")
        for testCase in TargetConformance.ssdpOnly {
            #expect(results[testCase.id]?["verdict"] as? String == "N/A", "\(testCase.id)")
        }
        // Everything a link carries ran: the control (the fetch a 00 hello asks for), the beacon, TLS and
        // stream cases, the busy location.
        let cases = TargetConformance.Cases.self
        for testCase in [BluetoothConformance.Cases.surpriseFetch, cases.noMatchNoConnect, cases.busyWaited] + TargetConformance.Cases.beacons {
            #expect(results[testCase.id]?["verdict"] as? String == "PASS", "\(testCase.id): \(results[testCase.id] ?? [:])\n\(run.output)")
        }
    }

    @Test("target mode over Bluetooth where nobody listens: bounded, the control fails, nothing else passes")
    func targetModeAgainstNobody() async throws {
        let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
        let people = try TestPeople(["suite"], label: "bt-target-nobody")
        let suite = try people["suite"]
        let jsonPath = suite.home.path + "/target.json"
        let scope = "bt-target-nobody-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let run = try ChildProcess(executable, [
            "conformance", "target", "--bluetooth", "02:00:00:00:00:01", "--peer-key", randomPublicKey(),
            "--identity", suite.home.path + "/identity.key", "--json-out", jsonPath,
        ], environment: ["THALI_BLUETOOTH_STANDIN": scope])
        let status = try await run.waitForExit(timeout: .seconds(30))
        #expect(status != 0, "a MUST fails: \(run.output)")
        let results = try Implementation.results(at: jsonPath)
        #expect(results[BluetoothConformance.Cases.surpriseFetch.id]?["verdict"] as? String == "FAIL", "\(run.output)")
        for (id, result) in results { #expect(result["verdict"] as? String != "PASS", "\(id)") }
    }
}
