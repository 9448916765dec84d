/// The conformance suite's hook for PSK-1.5 (spec/psk-tls.md §1): a client asks the server of an
/// established session for a second handshake, and learns how the server answered. This profile never
/// renegotiates on its own: every context sets `SSL_OP_NO_RENEGOTIATION`, which OpenSSL also applies
/// to its own requests, so the request clears it on that one connection first.
package enum PSKTLSRenegotiation {
    /// An outbound user event for a client `PSKTLSHandler` whose handshake is done: sends a new
    /// ClientHello inside the session. Its promise fails when the handler is no established client
    /// session or OpenSSL refuses to start.
    package struct Request: Sendable {
        package init() {}
    }

    /// The inbound user event that tells how the server answered the request (a fatal alert or a closed
    /// connection is reported as usual, through `errorCaught` and `channelInactive`).
    package enum Outcome: Sendable, Hashable {
        /// The second handshake finished: the server renegotiated.
        case renegotiated
        /// The server answered with this warning alert (RFC 5246 §7.2.2: `no_renegotiation`); OpenSSL's
        /// client, which asked for a reason, then ends the session with a fatal `handshake_failure`.
        case warned(TLSAlert)
    }
}
