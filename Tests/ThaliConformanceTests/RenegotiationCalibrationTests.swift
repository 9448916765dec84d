import NIOPosix
import Testing
import ThaliPSKTLS
import ThaliTestSupport

@testable import ThaliConformance

/// `peer/psk-tls/renegotiation-refused` [PSK-1.5] calibrated against an independent server: OpenSSL's
/// `s_server`, which since 3.0 refuses a client's renegotiation unless told `-client_renegotiation`, and
/// our own `PSKTLSServer`.
@Suite("Conformance renegotiation probe", .serialized, .enabled(if: TestEnvironment.available(ChildProcess.which("openssl") != nil)))
struct RenegotiationCalibrationTests {
    static let psk: [UInt8] = Array(1...16)

    /// An `openssl s_server` with the Thali suite and `psk` (it takes any identity), plus `flags`.
    static func server(_ flags: [String]) async throws -> (ChildProcess, Int) {
        let server = try ChildProcess("openssl", [
            "s_server", "-accept", "127.0.0.1:0", "-nocert", "-tls1_2", "-psk", psk.map { String($0, radix: 16).leftPadded(to: 2) }.joined(),
            "-cipher", "DHE-PSK-AES256-GCM-SHA384",
        ] + flags)
        return (server, try await PeerModeTests.acceptPort(server))
    }

    static func probe(port: Int) async -> RenegotiationProbe.Outcome {
        await RenegotiationProbe.run(host: "127.0.0.1", port: port, identity: "conformance", psk: psk, timeout: .seconds(5),
                                     group: MultiThreadedEventLoopGroup.singleton)
    }

    @Test("s_server as it comes (OpenSSL 3 refuses client renegotiation): a warning no_renegotiation, PASS")
    func refusingServer() async throws {
        let (server, port) = try await Self.server([])
        defer { _ = server.terminate() }
        let outcome = await Self.probe(port: port)
        #expect(outcome == .warned(.noRenegotiation), "\(outcome)\n\(server.output)")
        #expect(outcome.verdict == .pass)
    }

    @Test("s_server -client_renegotiation: a second handshake runs, FAIL")
    func renegotiatingServer() async throws {
        let (server, port) = try await Self.server(["-client_renegotiation"])
        defer { _ = server.terminate() }
        let outcome = await Self.probe(port: port)
        #expect(outcome == .renegotiated, "\(outcome)\n\(server.output)")
        #expect(outcome.verdict == .fail)
    }

    @Test("our PSKTLSServer (SSL_OP_NO_RENEGOTIATION): a warning no_renegotiation, PASS")
    func ourServer() async throws {
        let server = try await PSKTLSServer.serve(host: "127.0.0.1", port: 0) { _ in Self.psk }
        defer { Task { await server.close() } }
        let outcome = await Self.probe(port: server.port)
        #expect(outcome == .warned(.noRenegotiation), "\(outcome)")
    }

    @Test("the verdicts: no_renegotiation at either level passes, another refusal warns, a second handshake fails")
    func verdicts() {
        #expect(RenegotiationProbe.Outcome.fatalAlert(.noRenegotiation).verdict == .pass)
        #expect(RenegotiationProbe.Outcome.fatalAlert(.handshakeFailure).verdict == .warn)
        #expect(RenegotiationProbe.Outcome.warned(.userCanceled).verdict == .warn)
        #expect(RenegotiationProbe.Outcome.closedWithoutAlert.verdict == .warn)
        #expect(RenegotiationProbe.Outcome.ignored(milliseconds: 5000).verdict == .warn)
        #expect(RenegotiationProbe.Outcome.noSession("refused").verdict == .inconclusive)
    }
}

private extension String {
    func leftPadded(to width: Int) -> String { String(repeating: "0", count: max(0, width - count)) + self }
}
