import Foundation
import NIOCore
import Testing
import ThaliPSKTLS
import ThaliTestSupport

/// Our client against GnuTLS's `gnutls-serv` (Debian `gnutls-bin`): a second, independent TLS stack.
/// (`gnutls-cli` 3.7.9 completes the handshake against a server without a PSK identity hint, as the
/// profile requires, and then crashes printing the empty hint, so it cannot serve as a client peer.)
extension PSKTLSTests {
    @Suite(.enabled(if: TestEnvironment.available(ChildProcess.which("gnutls-serv") != nil),
                    "needs gnutls-serv (scripts/bootstrap.sh --test installs gnutls-bin)"))
    struct GnuTLSInteropTests {
        static let priority = "NORMAL:-VERS-ALL:+VERS-TLS1.2:-KX-ALL:+DHE-PSK:-CIPHER-ALL:+AES-256-GCM"

        @Test(arguments: [DHGroup.ffdhe2048, .ffdhe3072])
        func ourClientAgainstGnuTLSServer(group: DHGroup) async throws {
            try await expectNoLeaks {
                let passwords = "\(Fixtures.scratch)/gnutls-psk-\(group.rawValue).txt"
                try "\(Fixtures.identity192):\(Fixtures.hex(Fixtures.psk))\n".write(toFile: passwords, atomically: true, encoding: .utf8)
                let server = try ChildProcess("gnutls-serv", [
                    "--echo", "--priority", Self.priority, "--pskpasswd", passwords,
                    "--dhparams", try await Fixtures.dhParameterFile(group.rawValue), "-p", "0",
                ])
                defer { server.terminate(signal: SIGKILL) }  // gnutls-serv ignores SIGTERM
                let port = try await server.listeningIPv4Port()
                let connection = try await PSKTLSClient.connect(
                    host: "127.0.0.1", port: port, identity: Fixtures.identity192, psk: Fixtures.psk)
                #expect(connection.parameters.cipherSuite == "DHE-PSK-AES256-GCM-SHA384")
                #expect(connection.parameters.dhGroupBits == group.bits)
                try await connection.executeThenClose { inbound, outbound in
                    let message = Array("6 echo me, GnuTLS\n".utf8)
                    try await outbound.write(ByteBuffer(bytes: message))
                    var iterator = inbound.makeAsyncIterator()
                    #expect(try await readBytes(&iterator, count: message.count) == message)
                }
                // GnuTLS names the identity it accepted (all 192 characters).
                try await server.waitForOutput(containing: "Connected as '\(Fixtures.identity192)'")
            }
        }

        @Test func gnuTLSServerRefusesAnUnknownIdentity() async throws {
            try await expectNoLeaks {
                let passwords = "\(Fixtures.scratch)/gnutls-psk-unknown.txt"
                try "someone-else:\(Fixtures.hex(Fixtures.psk))\n".write(toFile: passwords, atomically: true, encoding: .utf8)
                let server = try ChildProcess("gnutls-serv", [
                    "--echo", "--priority", Self.priority, "--pskpasswd", passwords,
                    "--dhparams", try await Fixtures.dhParameterFile("ffdhe2048"), "-p", "0",
                ])
                defer { server.terminate(signal: SIGKILL) }  // gnutls-serv ignores SIGTERM
                let port = try await server.listeningIPv4Port()
                let error = await #expect(throws: PSKTLSError.self) {
                    _ = try await PSKTLSClient.connect(host: "127.0.0.1", port: port, identity: Fixtures.identity192,
                                                       psk: Fixtures.psk)
                }
                // GnuTLS answers an unknown identity as if the PSK were wrong (it hides which identities exist).
                #expect(error?.reason == .alertReceived(.badRecordMAC), "\(String(describing: error))")
            }
        }
    }
}
