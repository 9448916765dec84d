import NIOCore
import NIOPosix
import Testing
import ThaliAdmission
import ThaliPSKTLS
import ThaliTestSupport

// Nested in the serialized PSKTLSTests: its leak checks count live OpenSSL objects process-wide, so a
// suite that makes contexts and connections must not run beside them.
extension PSKTLSTests {
    /// PSKTLSServer refuses a source in its refusal period in the kernel (ThaliAdmission's
    /// `ListenerSourceFilter`): real sockets on loopback, a real handshake for the source that is not refused.
    @Suite("PSKTLSServer kernel source filter", .serialized)
    struct PSKTLSServerSourceFilterTests {
        private static let lookup: PSKLookup = { $0 == Fixtures.identity192 ? Fixtures.psk : nil }

        @Test("a source over its rate is refused once after its accept, then the kernel drops it; a contact's handshake still completes")
        func refusedSourceNeverReachesTheServer() async throws {
            var admission = AdmissionLimits()
            admission.maxConnectionsPerSource = 3
            admission.sourceRefusalPeriod = .seconds(30)
            let server = try await PSKTLSServer.serve(host: "127.0.0.1", port: 0, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048),
                                                      admission: admission, lookup: Self.lookup)
            for _ in 0..<4 { #expect(await connect(from: "127.0.0.2", port: server.port) == .connected) }
            // The fourth was refused after its accept; the filter follows on the listener's event loop.
            _ = try await waitUntil(timeout: .seconds(5), every: .milliseconds(5)) { !server.filteredSources.isEmpty }
            #expect(server.filteredSources == ["127.0.0.2"])
            let before = server.statistics

            for _ in 0..<3 { #expect(await connect(from: "127.0.0.2", port: server.port) == .timedOut) }
            let connection = try await PSKTLSClient().connect(host: "127.0.0.1", port: server.port,
                                                              identity: Fixtures.identity192, psk: Fixtures.psk)
            try await connection.executeThenClose { _, outbound in outbound.finish() }
            // The server counts the handshake on its own event loop, possibly after the client saw it complete.
            _ = try await waitUntil(timeout: .seconds(5), every: .milliseconds(5)) { server.statistics.established > 0 }
            #expect(server.statistics.established == 1)
            #expect(server.statistics.refused == before.refused, "the refused source reached the server: \(server.statistics)")
            #expect(server.statistics.accepted == before.accepted + 1)
            await server.close()
        }
    }
}
