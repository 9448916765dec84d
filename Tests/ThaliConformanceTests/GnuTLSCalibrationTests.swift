import Foundation
import NIOPosix
import Testing
import ThaliBeacons
import ThaliConformance
import ThaliTestSupport

/// Peer mode's TLS cases against GnuTLS's `gnutls-serv` (Debian `gnutls-bin`), a TLS stack independent of
/// OpenSSL, configured for the profile (TLS 1.2, DHE-PSK, AES-256-GCM, the 2048-bit FFDHE group) with an
/// identity the suite does not use: the calibration spec/conformance.md reports.
@Suite(.enabled(if: TestEnvironment.available(ChildProcess.which("gnutls-serv") != nil),
                "needs gnutls-serv (scripts/bootstrap.sh --test installs gnutls-bin)"))
struct GnuTLSCalibrationTests {
    static let priority = "NORMAL:-VERS-ALL:+VERS-TLS1.2:-KX-ALL:+DHE-PSK:-CIPHER-ALL:+AES-256-GCM"

    @Test("gnutls-serv in the profile: group, freshness, hint, compression and suites PASS; its tickets FAIL; its alerts for TLS 1.3 and an unknown identity WARN")
    func gnuTLSServer() async throws {
        let directory = try PeerModeTests.scratchDirectory("gnutls")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await PeerModeTests.openssl(["genpkey", "-genparam", "-algorithm", "DH", "-pkeyopt", "group:ffdhe2048", "-out", directory + "/dh.pem"])
        try "someone-else:0102030405060708090a0b0c0d0e0f10\n".write(toFile: directory + "/psk.txt", atomically: true, encoding: .utf8)
        let server = try ChildProcess("gnutls-serv", [
            "--echo", "--priority", Self.priority, "--pskpasswd", directory + "/psk.txt", "--dhparams", directory + "/dh.pem", "-p", "0",
        ])
        defer { server.terminate(signal: SIGKILL) }  // gnutls-serv ignores SIGTERM
        let report = try await PeerModeTests.gradeBroken(port: try await server.listeningIPv4Port())
        for id in ["peer/psk-tls/dh-group-size", "peer/psk-tls/dh-fresh", "peer/psk-tls/no-identity-hint", "peer/psk-tls/no-compression",
                   "peer/psk-tls/other-suites-refused"] {
            #expect(report.result(id)?.verdict == .pass, "\(id)\n\(report.table)")
        }
        #expect(report.result("peer/psk-tls/dh-group-size")?.actual == "2048 bits", "\(report.table)")
        // GnuTLS servers issue session tickets unless told --noticket (resumption would skip the PSK lookup).
        let tickets = try #require(report.result("peer/psk-tls/no-session-tickets"))
        #expect(tickets.verdict == .fail && tickets.actual == "session_ticket extension sent", "\(report.table)")
        // A TLS 1.3-only ClientHello gets handshake_failure, not protocol_version: refused, but not as specified.
        let tls13 = try #require(report.result("peer/psk-tls/tls13-refused"))
        #expect(tls13.verdict == .warn && tls13.actual.contains("handshake_failure"), "\(report.table)")
        // GnuTLS answers an unknown identity as a wrong PSK (bad_record_mac), hiding which identities exist.
        let unknown = try #require(report.result("peer/psk-tls/unknown-identity"))
        #expect(unknown.verdict == .warn && unknown.actual.contains("bad_record_mac"), "\(report.table)")
        #expect(!report.succeeded)
    }
}
