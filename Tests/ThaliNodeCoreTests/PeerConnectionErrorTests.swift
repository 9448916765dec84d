import NIOCore
#if canImport(Glibc)
import Glibc
#endif
import NIOPosix
import Testing
import TCPMultiplexer
import ThaliPSKTLS
import ThaliSSDP
@testable import ThaliNodeCore

/// Connection failures as the API reports them: typed reasons made from the network stack's errors,
/// described in words.
@Suite struct PeerConnectionErrorTests {
    @Test func aRefusedConnectionSaysWhoRefusedIt() async throws {
        // A port that was just free: nothing listens there now.
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(server.localAddress?.port)
        try await server.close()
        let location = BeaconLocation(host: "127.0.0.1", port: port)
        do {
            _ = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: location.host, port: port).get()
            Issue.record("connected to a closed port")
        } catch {
            let failure = PeerConnectionError(error, connectingTo: location)
            #expect(failure.reason == .refused)
            #expect(failure.description == "connection refused by 127.0.0.1:\(port)")
        }
    }

    @Test func failuresOfEachLayerAreTypedAndWorded() {
        let location = BeaconLocation(host: "127.0.0.5", port: 40000)
        let alert = PeerConnectionError(PSKTLSError(.alertReceived(.unknownPSKIdentity), role: .client), connectingTo: location)
        #expect(alert.reason == .tls(.alertReceived(.unknownPSKIdentity)))
        #expect(alert.description.hasPrefix("PSK-TLS with 127.0.0.5:40000 failed: "))
        #expect(alert.description.contains("unknown_psk_identity"))
        #expect(PeerConnectionError(ChannelError.connectTimeout(.seconds(1)), connectingTo: location).reason == .timedOut)
        #expect(PeerConnectionError(ChannelError.eof, connectingTo: location).description == "127.0.0.5:40000 closed the connection")
        #expect(PeerConnectionError(IOError(errnoCode: ECONNRESET, reason: "read"), connectingTo: location).reason == .reset)
        // An authenticated session that went silent, by either timer: one reason, in words.
        let unanswered = PeerConnectionError(MultiplexerError.keepAliveTimeout, connectingTo: location)
        #expect(unanswered.reason == .stalled)
        #expect(unanswered.description == "the session with 127.0.0.5:40000 went silent (its keepalive ping went unanswered) and was closed")
        let idle = PeerConnectionError(DeliveryIdleTimeout(timeout: .seconds(60)), connectingTo: location)
        #expect(idle.reason == .stalled && idle.description.contains("went silent (nothing sent or received for 60000 ms)"))
        #expect(PeerConnectionError(MultiplexerError.idleTimeout, connectingTo: location).reason == .multiplexer(.idleTimeout))
        // A stop, and a system error without a reason of its own, in words: no type names.
        let stopped = PeerConnectionError(CancellationError(), connectingTo: location)
        #expect(stopped.reason == .cancelled && stopped.description == "connection with 127.0.0.5:40000 closed: this peer stopped")
        let denied = PeerConnectionError(IOError(errnoCode: EACCES, reason: "connect"), connectingTo: location)
        #expect(denied.reason == .other && denied.description == "connection to 127.0.0.5:40000 failed: Permission denied")
        // Printing an event shows the words, not the type.
        #expect("\(PeerEvent.connectionFailed(contact: .sample("bob"), reason: alert, retryIn: nil))".contains("unknown_psk_identity"))
    }
}
