import Foundation
import NIOCore
import Testing
import ThaliPSKTLS
import ThaliTestSupport

/// ALPN (RFC 7301) on PSK-TLS: what marks a Thali session's streams (spec/psk-tls.md). Checked against
/// OpenSSL's own `s_client` and `s_server`, and between our two sides.
extension PSKTLSTests {
    @Suite struct ApplicationProtocolTests {
        static let marked = "thali-streams/1"

        static func configuration(_ protocols: [String]) -> PSKTLSConfiguration {
            var configuration = PSKTLSConfiguration(dhGroup: .ffdhe2048)
            configuration.applicationProtocols = protocols
            return configuration
        }

        static func serve(_ protocols: [String]) async throws -> PSKTLSServer {
            try await PSKTLSServer.serve(host: "127.0.0.1", port: 0, configuration: configuration(protocols)) {
                $0 == Fixtures.identity192 ? Fixtures.psk : nil
            }
        }

        /// The protocol our server agreed on with `openssl s_client -alpn offered` (`-brief` does not print it).
        static func sClientNegotiates(offering offered: String, serverProtocols: [String]) async throws -> String? {
            let server = try await serve(serverProtocols)
            let client = try InteropTests.startClient(port: server.port, extra: ["-tls1_2", "-cipher", InteropTests.cipher, "-alpn", offered])
            defer { client.terminate() }
            var connections = server.connections.makeAsyncIterator()
            let connection = try #require(await connections.next())
            try await client.waitForOutput(containing: "Protocol version")
            try await connection.executeThenClose { _, _ in }
            await server.close()
            return connection.parameters.applicationProtocol
        }

        @Test("openssl s_client offering thali-streams/1 among others: our server selects it")
        func sClientGetsTheMarkedProtocol() async throws {
            let selected = try await Self.sClientNegotiates(offering: "h2,\(Self.marked)", serverProtocols: [Self.marked])
            #expect(selected == Self.marked)
        }

        @Test("openssl s_client offering only other protocols: the handshake succeeds without ALPN")
        func sClientOfferingOthersConnectsUnmarked() async throws {
            let selected = try await Self.sClientNegotiates(offering: "h2,http/1.1", serverProtocols: [Self.marked])
            #expect(selected == nil)
        }

        @Test("our client against openssl s_server -alpn: the client sees the selection")
        func ourClientAgainstSServer() async throws {
            let server = try InteropTests.startServer(dhParameters: try await Fixtures.dhParameterFile("ffdhe2048"),
                                                      extra: ["-tls1_2", "-alpn", Self.marked])
            defer { server.terminate() }
            let port = try await acceptPort(of: server)
            let connection = try await PSKTLSClient.connect(host: "127.0.0.1", port: port, identity: Fixtures.identity192,
                                                            psk: Fixtures.psk, configuration: Self.configuration([Self.marked]))
            #expect(connection.parameters.applicationProtocol == Self.marked)
            try await connection.executeThenClose { _, _ in }
        }

        @Test("between our sides: agreed when both name it, absent when either side does not", arguments: [
            ([marked], [marked], marked), (["other", marked], ["x", marked], marked),
            ([], [marked], nil), ([marked], [], nil), (["other"], [marked], nil),
        ] as [([String], [String], String?)])
        func ourSides(client: [String], server: [String], expected: String?) async throws {
            let listener = try await Self.serve(server)
            let connection = try await PSKTLSClient.connect(host: "127.0.0.1", port: listener.port, identity: Fixtures.identity192,
                                                            psk: Fixtures.psk, configuration: Self.configuration(client))
            #expect(connection.parameters.applicationProtocol == expected)
            var connections = listener.connections.makeAsyncIterator()
            let accepted = try #require(await connections.next())
            #expect(accepted.parameters.applicationProtocol == expected)
            try await connection.executeThenClose { _, _ in }
            try await accepted.executeThenClose { _, _ in }
            await listener.close()
        }

        @Test("names the wire cannot carry are refused when the context is built")
        func invalidNamesAreRefused() {
            for names in [[""], [String(repeating: "x", count: 256)], Array(repeating: "x", count: 17)] {
                #expect(throws: PSKTLSError.self) { _ = try PSKTLSContext(role: .client, configuration: Self.configuration(names)) }
            }
        }
    }
}
