import Foundation
import NIOConcurrencyHelpers
import NIOPosix
import Testing
import ThaliBeacons
import ThaliTestSupport

@testable import ThaliConformance

/// Peer mode's raw multiplexer cases calibrated against an independent yamux: hashicorp/yamux, as the
/// echo server of `Tests/TCPMultiplexerTests/GoPeer` (`yamux-peer serve`, one fresh process per
/// connection, plain TCP). Where it follows spec/multiplexer.md the cases PASS; where it does not, the
/// verdict is FAIL with the rule quoted.
@Suite("Conformance raw yamux cases against Go's hashicorp/yamux", .serialized,
       .enabled(if: TestEnvironment.available(ChildProcess.which("go") != nil
                                              && FileManager.default.fileExists(atPath: "/usr/share/gocode/src/github.com/hashicorp/yamux")),
                "needs golang-go and golang-github-hashicorp-yamux-dev"))
struct GoYamuxCalibrationTests {

    /// Builds `yamux-peer` into `directory`.
    static func buildPeer(into directory: String) async throws -> String {
        let binary = directory + "/yamux-peer"
        let build = try ChildProcess("go", ["build", "-o", binary, PackagePaths.root() + "/Tests/TCPMultiplexerTests/GoPeer/main.go"],
                                     environment: ["GO111MODULE": "off", "GOPATH": "/usr/share/gocode", "GOCACHE": directory + "/cache"])
        #expect(try await build.waitForExit(timeout: .seconds(180)) == 0, "\(build.output)")
        return binary
    }

    @Test("ping, reset stream and GoAway PASS; data after FIN and a stream of the wrong parity FAIL, their rules quoted; the window overrun's GoAway is lost to its close")
    func gradesHashicorpYamux() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-conf-goyamux-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let binary = try await Self.buildPeer(into: directory)
        let servers = NIOLockedValueBox<[ChildProcess]>([])
        defer { for server in servers.withLockedValue({ $0 }) { _ = server.terminate() } }
        // `serve` takes one connection: each session of the cases gets its own server.
        let target = RawYamuxTarget.plain {
            let server = try ChildProcess(binary, ["serve"])
            servers.withLockedValue { $0.append(server) }
            try await server.waitForOutput(containing: "LISTENING ")
            let line = server.output.split(separator: "\n").first { $0.hasPrefix("LISTENING ") }
            return ("127.0.0.1", try #require(line.flatMap { Int($0.dropFirst("LISTENING ".count)) }))
        }
        var configuration = PeerConformanceConfiguration(peerKey: PrivateKey().publicKey, identity: PrivateKey(), address: "127.0.0.1")
        configuration.stepTimeout = .seconds(2)
        let catalog = try RequirementCatalog.load(from: RequirementCatalog.defaultPath)
        let run = ConformanceRun(target: "hashicorp/yamux", catalog: catalog)
        await PeerConformance(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton).gradeRawMultiplexer(run, against: target)

        let report = run.report
        let cases = PeerConformance.Cases.self
        var verdicts: [String: ConformanceVerdict] = [:]
        for result in report.results { verdicts[result.testCase.id] = result.verdict }
        // hashicorp/yamux keeps the bytes that follow a FIN and takes a stream of either parity: it answers
        // neither with anything, and the session goes on.
        #expect(verdicts.filter { $0.key != cases.windowOverrun.id }
                    == [cases.pingAnswered.id: .pass, cases.resetStream.id: .pass, cases.goAwayNormal.id: .pass,
                        cases.dataAfterFIN.id: .fail, cases.wrongParity.id: .fail],
                "\(report.table)")
        // Judged at the answer to the Ping sent behind those frames, not at the step timeout.
        #expect(report.result(cases.dataAfterFIN.id)?.actual == "no RST: the Ping sent behind the data was answered first, the Ping answered",
                "\(report.table)")
        #expect(report.result(cases.wrongParity.id)?.actual == "no GoAway: the Ping sent behind it was answered", "\(report.table)")
        // It refuses the overrun at the header and queues GoAway 1, but closes the connection from the
        // reading goroutine at once, and the writer rarely sends the GoAway first: the wire shows a bare close
        // (FAIL, MUX-2.15). Should the writer win, it is a PASS; nothing else is right.
        let overrun = try #require(report.result(cases.windowOverrun.id))
        #expect(overrun.verdict == .fail && overrun.actual == "the connection ended" || overrun.verdict == .pass, "\(report.table)")
        // Each failure quotes the rules it breaks, from the catalog.
        for rule in ["MUX-2.10", "MUX-2.5"] + (overrun.verdict == .fail ? ["MUX-2.12", "MUX-2.15"] : []) {
            let quoted = try #require(catalog[rule]).rule
            #expect(report.table.contains(quoted), "\(rule) is not quoted: \(report.table)")
        }
    }
}
