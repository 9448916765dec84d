import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import ThaliPSKTLS
import ThaliTestSupport

/// Our client against `openssl s_server`, our server against `openssl s_client`: real processes.
extension PSKTLSTests {
    @Suite struct InteropTests {
        static let cipher = "DHE-PSK-AES256-GCM-SHA384"

        /// Starts `openssl s_server` for one connection with the given DH parameter file.
        static func startServer(dhParameters: String, psk: [UInt8] = Fixtures.psk, extra: [String] = ["-tls1_2"],
                                cipher: String = cipher) throws -> ChildProcess {
            try ChildProcess("openssl", [
                "s_server", "-accept", "127.0.0.1:0", "-naccept", "1", "-nocert",
                "-psk", Fixtures.hex(psk), "-psk_identity", Fixtures.identity192,
                "-cipher", cipher, "-dhparam", dhParameters,
            ] + extra)
        }

        /// Starts `openssl s_client -brief` against our server.
        static func startClient(port: Int, identity: String = Fixtures.identity192, psk: [UInt8] = Fixtures.psk,
                                extra: [String] = ["-tls1_2", "-cipher", cipher]) throws -> ChildProcess {
            try ChildProcess("openssl", [
                "s_client", "-connect", "127.0.0.1:\(port)", "-brief",
                "-psk", Fixtures.hex(psk), "-psk_identity", identity,
            ] + extra)
        }

        static func serve(group: DHGroup = .ffdhe2048, timeout: Duration = .seconds(10),
                          lookup: @escaping PSKLookup = { $0 == Fixtures.identity192 ? Fixtures.psk : nil }) async throws -> PSKTLSServer {
            var configuration = PSKTLSConfiguration(dhGroup: group)
            configuration.handshakeTimeout = timeout
            return try await PSKTLSServer.serve(host: "127.0.0.1", port: 0, configuration: configuration, lookup: lookup)
        }

        /// The first handshake failure the server reports.
        static func firstFailure(of server: PSKTLSServer) async throws -> PSKTLSError {
            var failures = server.handshakeFailures.makeAsyncIterator()
            return try #require(await failures.next())
        }

        // MARK: Our client, OpenSSL's server

        @Test(arguments: DHGroup.allCases)
        func ourClientAgainstSServer(group: DHGroup) async throws {
            try await expectNoLeaks {
                let server = try Self.startServer(dhParameters: try await Fixtures.dhParameterFile(group.rawValue))
                defer { server.terminate() }
                let port = try await acceptPort(of: server)
                let connection = try await PSKTLSClient.connect(
                    host: "127.0.0.1", port: port, identity: Fixtures.identity192, psk: Fixtures.psk)
                #expect(connection.parameters.protocolVersion == "TLSv1.2")
                #expect(connection.parameters.cipherSuite == Self.cipher)
                #expect(connection.parameters.dhGroupBits == group.bits)
                try await connection.executeThenClose { inbound, outbound in
                    try await outbound.write(ByteBuffer(string: "1 hello from swift\n"))
                    try await server.waitForOutput(containing: "1 hello from swift")
                    server.write("2 hello from openssl\n")
                    var iterator = inbound.makeAsyncIterator()
                    let reply = try await readBytes(&iterator, count: 21)
                    #expect(String(decoding: reply, as: UTF8.self) == "2 hello from openssl\n")
                }
                // Our close_notify ends s_server's connection cleanly, and with -naccept 1 the process.
                try await server.waitForOutput(containing: "CONNECTION CLOSED")
            }
        }

        @Test func ourClientWithTheWrongPSKGetsBadRecordMAC() async throws {
            try await expectNoLeaks {
                let server = try Self.startServer(dhParameters: try await Fixtures.dhParameterFile("ffdhe2048"))
                defer { server.terminate() }
                let port = try await acceptPort(of: server)
                let error = await #expect(throws: PSKTLSError.self) {
                    _ = try await PSKTLSClient.connect(host: "127.0.0.1", port: port, identity: Fixtures.identity192,
                                                       psk: Fixtures.otherPSK)
                }
                #expect(error?.reason == .alertReceived(.badRecordMAC))
            }
        }

        @Test func ourClientRefusesADHGroupUnder2048Bits() async throws {
            try await expectNoLeaks {
                // s_server would refuse its own 1536-bit group at the default security level: lower it there.
                let server = try Self.startServer(dhParameters: try await Fixtures.dhParameterFile("modp_1536"),
                                                  cipher: "\(Self.cipher):@SECLEVEL=0")
                defer { server.terminate() }
                let port = try await acceptPort(of: server)
                let error = await #expect(throws: PSKTLSError.self) {
                    _ = try await PSKTLSClient.connect(host: "127.0.0.1", port: port, identity: Fixtures.identity192,
                                                       psk: Fixtures.psk)
                }
                #expect(error?.reason == .alertSent(.handshakeFailure))
                #expect(error?.detail.contains("dh key too small") == true, "\(String(describing: error))")
            }
        }

        @Test func ourClientAgainstATLS13OnlyServerGetsProtocolVersion() async throws {
            try await expectNoLeaks {
                let server = try Self.startServer(dhParameters: try await Fixtures.dhParameterFile("ffdhe2048"), extra: ["-tls1_3"])
                defer { server.terminate() }
                let port = try await acceptPort(of: server)
                let error = await #expect(throws: PSKTLSError.self) {
                    _ = try await PSKTLSClient.connect(host: "127.0.0.1", port: port, identity: Fixtures.identity192,
                                                       psk: Fixtures.psk)
                }
                #expect(error?.reason == .alertReceived(.protocolVersion))
            }
        }

        @Test func ourClientTimesOutAgainstAServerThatNeverAnswers() async throws {
            try await expectNoLeaks {
                let silent = try await SilentTCPServer()
                var configuration = PSKTLSConfiguration()
                configuration.handshakeTimeout = .milliseconds(300)
                let error = await #expect(throws: PSKTLSError.self) {
                    _ = try await PSKTLSClient.connect(host: "127.0.0.1", port: silent.port, identity: "id",
                                                       psk: Fixtures.psk, configuration: configuration)
                }
                #expect(error?.reason == .handshakeTimedOut)
                await silent.close()
            }
        }

        @Test func ourClientReportsAServerThatHangsUp() async throws {
            try await expectNoLeaks {
                let closing = try await SilentTCPServer(hangUp: true)
                let error = await #expect(throws: PSKTLSError.self) {
                    _ = try await PSKTLSClient.connect(host: "127.0.0.1", port: closing.port, identity: "id", psk: Fixtures.psk)
                }
                #expect(error?.reason == .closedDuringHandshake)
                await closing.close()
            }
        }

        // MARK: OpenSSL's client, our server

        @Test(arguments: DHGroup.allCases)
        func sClientAgainstOurServer(group: DHGroup) async throws {
            try await expectNoLeaks {
                let server = try await Self.serve(group: group)
                let client = try Self.startClient(port: server.port)
                defer { client.terminate() }
                var connections = server.connections.makeAsyncIterator()
                let connection = try #require(await connections.next())
                #expect(connection.parameters.pskIdentity == Fixtures.identity192)
                #expect(connection.parameters.dhGroupBits == group.bits)
                // The line ends the handshake summary; wait for all of it, not just its start, which can
                // arrive in a read of its own.
                try await client.waitForOutput(containing: "Server Temp Key")
                try await client.waitForOutput(containing: " bits\n")
                #expect(client.output.contains("Protocol version: TLSv1.2"))
                #expect(client.output.contains("Ciphersuite: \(Self.cipher)"))
                #expect(client.output.contains("Server Temp Key: DH, \(group.bits) bits"))
                try await connection.executeThenClose { inbound, outbound in
                    var iterator = inbound.makeAsyncIterator()
                    client.write("3 hello from s_client\n")
                    let received = try await readBytes(&iterator, count: 22)
                    #expect(String(decoding: received, as: UTF8.self) == "3 hello from s_client\n")
                    try await outbound.write(ByteBuffer(string: "4 hello from swift\n"))
                    try await client.waitForOutput(containing: "4 hello from swift")
                    // s_client sends close_notify when its input ends: our inbound ends without an error.
                    client.closeInput()
                    let rest = try await readAll(&iterator)
                    #expect(rest.isEmpty)
                }
                #expect(try await client.waitForExit() == 0)
                #expect(server.statistics.established == 1 && server.statistics.failed == 0)
                await server.close()
            }
        }

        @Test func unknownIdentityIsRefusedWithUnknownPSKIdentity() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve()
                let client = try Self.startClient(port: server.port, identity: "somebody-else")
                defer { client.terminate() }
                let failure = try await Self.firstFailure(of: server)
                #expect(failure.reason == .alertSent(.unknownPSKIdentity))
                try await client.waitForOutput(containing: "unknown psk identity")
                #expect(try await client.waitForExit() != 0)
                await server.close()
            }
        }

        @Test func expiredIdentityIsRefusedWithUnknownPSKIdentity() async throws {
            try await expectNoLeaks {
                // The lookup knows the identity until it expires, like the beacon PSK table; the test
                // decides when that happens instead of racing a clock.
                let expired = NIOLockedValueBox(false)
                let server = try await Self.serve { identity in
                    identity == Fixtures.identity192 && !expired.withLockedValue { $0 } ? Fixtures.psk : nil
                }
                let early = try Self.startClient(port: server.port)
                defer { early.terminate() }
                var connections = server.connections.makeAsyncIterator()
                let accepted = try #require(await connections.next())
                #expect(accepted.parameters.pskIdentity == Fixtures.identity192)
                try await accepted.executeThenClose { _, _ in }

                expired.withLockedValue { $0 = true }
                let late = try Self.startClient(port: server.port)
                defer { late.terminate() }
                let failure = try await Self.firstFailure(of: server)
                #expect(failure.reason == .alertSent(.unknownPSKIdentity))
                try await late.waitForOutput(containing: "unknown psk identity")
                await server.close()
            }
        }

        @Test func wrongPSKFromSClientIsRefused() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve()
                let client = try Self.startClient(port: server.port, psk: Fixtures.otherPSK)
                defer { client.terminate() }
                let failure = try await Self.firstFailure(of: server)
                #expect(failure.reason == .alertSent(.badRecordMAC))
                try await client.waitForOutput(containing: "bad record mac")
                await server.close()
            }
        }

        @Test func aTLS13OnlyClientIsRefusedWithProtocolVersion() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve()
                let client = try Self.startClient(port: server.port, extra: ["-tls1_3"])
                defer { client.terminate() }
                let failure = try await Self.firstFailure(of: server)
                #expect(failure.reason == .alertSent(.protocolVersion))
                #expect(try await client.waitForExit() != 0)
                await server.close()
            }
        }

        @Test(arguments: ["PSK-AES256-GCM-SHA384", "ECDHE-PSK-AES256-CBC-SHA384", "DHE-PSK-AES128-GCM-SHA256"])
        func aClientOfferingOnlyOtherSuitesIsRefused(suite: String) async throws {
            try await expectNoLeaks {
                let server = try await Self.serve()
                let client = try Self.startClient(port: server.port, extra: ["-tls1_2", "-cipher", suite])
                defer { client.terminate() }
                let failure = try await Self.firstFailure(of: server)
                #expect(failure.reason == .alertSent(.handshakeFailure))
                #expect(failure.detail.contains("no shared cipher"), "\(failure)")
                #expect(try await client.waitForExit() != 0)
                await server.close()
            }
        }

        /// Bytes that are not a ClientHello, with what OpenSSL makes of them: some inputs get an alert,
        /// some are so far from TLS that OpenSSL closes without one (its reason is in `detail`).
        static let garbage: [(bytes: [UInt8], reason: PSKTLSError.Reason, detail: String)] = [
            (Array("GET /NotificationBeacons HTTP/1.1\r\nHost: x\r\n\r\n".utf8), .failed, "http request"),
            ([0x16, 0x03, 0x01, 0x00, 0x05, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF], .alertSent(.unexpectedMessage), "unexpected message"),
            ([UInt8](repeating: 0xA5, count: 300), .failed, "wrong version number"),
        ]

        @Test(arguments: 0..<garbage.count)
        func garbageInsteadOfAClientHelloFails(index: Int) async throws {
            let garbage = Self.garbage[index]
            try await expectNoLeaks {
                let server = try await Self.serve()
                let raw = try await RawTCPClient(port: server.port, sending: garbage.bytes)
                let failure = try await Self.firstFailure(of: server)
                #expect(failure.reason == garbage.reason)
                #expect(failure.detail.contains(garbage.detail), "\(failure)")
                try await raw.channel.closeFuture.get()  // the server hung up
                await server.close()
            }
        }

        @Test func aClientThatHangsUpMidHandshakeIsReported() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve()
                let raw = try await RawTCPClient(port: server.port, sending: [0x16, 0x03, 0x01, 0x01, 0x00, 0x01])
                await raw.close()
                let failure = try await Self.firstFailure(of: server)
                #expect(failure.reason == .closedDuringHandshake)
                await server.close()
            }
        }

        @Test func aClientThatStopsMidHandshakeTimesOut() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve(timeout: .milliseconds(300))
                // The first five bytes of a ClientHello record, then silence.
                let raw = try await RawTCPClient(port: server.port, sending: [0x16, 0x03, 0x01, 0x01, 0x00])
                let failure = try await Self.firstFailure(of: server)
                #expect(failure.reason == .handshakeTimedOut)
                try await raw.channel.closeFuture.get()
                #expect(try await eventually { server.statistics.open == 0 })
                await server.close()
            }
        }
    }
}
