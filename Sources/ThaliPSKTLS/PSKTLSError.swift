/// Why a PSK-TLS connection failed. Every failure of the handshake or of an established connection
/// surfaces as one of these, on the client and on the server.
public struct PSKTLSError: Error, Sendable, CustomStringConvertible {
    /// What went wrong, as a value tests and callers can match on.
    public enum Reason: Hashable, Sendable {
        /// The peer sent this fatal alert (for example `unknown_psk_identity` to a client whose identity
        /// the server does not know, or `bad_record_mac` to a client with the wrong PSK).
        case alertReceived(TLSAlert)
        /// This side detected a failure and sent this fatal alert to the peer.
        case alertSent(TLSAlert)
        /// The handshake did not finish within `PSKTLSConfiguration.handshakeTimeout`.
        case handshakeTimedOut
        /// The peer closed the TCP connection before the handshake finished, without an alert.
        case closedDuringHandshake
        /// The peer closed the TCP connection without a `close_notify` alert: the data may be truncated.
        case uncleanShutdown
        /// The handshake finished with a version, cipher suite or DH group this profile does not allow.
        case unacceptableNegotiation
        /// The identity or PSK given to the client is not usable (empty, too long, contains NUL).
        case invalidCredentials
        /// The configuration cannot be applied (OpenSSL refused a setting).
        case invalidConfiguration
        /// More plaintext was written before the handshake finished than
        /// `PSKTLSConfiguration.maximumBufferedPlaintextBeforeHandshake` allows.
        case writeBufferLimitExceeded
        /// A write or read after the connection was closed or failed.
        case connectionClosed
        /// OpenSSL reported a failure without sending or receiving an alert; `detail` holds its reasons.
        case failed
    }

    /// What went wrong.
    public let reason: Reason
    /// The side that reports it.
    public let role: PSKTLSRole
    /// Context: OpenSSL's error queue at the time of failure, or what was being checked.
    public let detail: String

    /// An error with its reason, reporting side and context.
    public init(_ reason: Reason, role: PSKTLSRole, detail: String = "") {
        self.reason = reason
        self.role = role
        self.detail = detail
    }

    /// The reason in words, with the context.
    public var description: String {
        let what: String
        switch reason {
        case .alertReceived(let alert): what = "received fatal alert \(alert)"
        case .alertSent(let alert): what = "sent fatal alert \(alert)"
        case .handshakeTimedOut: what = "handshake timed out"
        case .closedDuringHandshake: what = "peer closed the connection during the handshake"
        case .uncleanShutdown: what = "peer closed the connection without close_notify"
        case .unacceptableNegotiation: what = "negotiated parameters are not allowed by the profile"
        case .invalidCredentials: what = "invalid PSK identity or key"
        case .invalidConfiguration: what = "invalid configuration"
        case .writeBufferLimitExceeded: what = "too much plaintext buffered before the handshake finished"
        case .connectionClosed: what = "connection closed"
        case .failed: what = "TLS failure"
        }
        return detail.isEmpty ? "PSK-TLS \(role): \(what)" : "PSK-TLS \(role): \(what) (\(detail))"
    }
}
