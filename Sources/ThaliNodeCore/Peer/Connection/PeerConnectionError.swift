import NIOCore
import NIOPosix
import TCPMultiplexer
import ThaliPSKTLS
import ThaliSSDP

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why a connection to a contact, or the session on it, failed (``PeerEvent/connectionFailed(contact:reason:retryIn:)``):
/// made from the network stack's errors where they arise, and described in words ("connection refused
/// by 127.0.0.5:40000").
public struct PeerConnectionError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What went wrong.
    public enum Reason: Sendable, Hashable {
        /// Failures of the TCP connection: nothing listens at the address (`refused`), no connection
        /// within the connect timeout (`timedOut`), no route to the network or host (`unreachable`), the
        /// other side reset the connection (`reset`) or closed it before the session ended (`closed`).
        case refused, timedOut, unreachable, reset, closed
        /// PSK-TLS failed (an alert sent or received, a handshake that timed out, ...).
        case tls(PSKTLSError.Reason)
        /// The multiplexer on the authenticated connection failed.
        case multiplexer(MultiplexerError)
        /// The delivery protocol on the session failed.
        case delivery(DeliveryProtocolError)
        /// The authenticated session went silent: nothing moved on the delivery stream for its idle
        /// timeout, or the multiplexer's keepalive ping went unanswered (the contact's node hangs, or its
        /// link does). The session was closed; the link retries while the match is valid.
        case stalled
        /// Relay mode: the session carrying the relay ended.
        case relayClosed
        /// This peer stopped (or gave the connection up) while the connection or its session ran.
        case cancelled
        /// Any other failure; the detail says what.
        case other
    }

    /// The address the connection went to (`host:port`; over Bluetooth the relay's local port).
    public var address: String
    /// What went wrong.
    public var reason: Reason
    /// The underlying error's own words, for logs (empty when the reason says everything).
    public var detail: String

    /// An error for `reason` at `address`.
    public init(_ reason: Reason, address: String, detail: String = "") {
        (self.address, self.reason, self.detail) = (address, reason, detail)
    }

    /// The failure of a connection to `location`, from whatever the network stack, PSK-TLS, the
    /// multiplexer or the delivery protocol threw.
    public init(_ error: any Error, connectingTo location: BeaconLocation) {
        self.init(error, address: "\(location.host):\(location.port)")
    }

    /// The failure of a connection with `address` (`host:port`), from whatever the network stack,
    /// PSK-TLS, the multiplexer or the delivery protocol threw.
    public init(_ error: any Error, address: String) {
        switch error {
        case let error as PeerConnectionError:
            self = error
        case is CancellationError:
            self.init(.cancelled, address: address)
        case let error as PSKTLSError:
            self.init(.tls(error.reason), address: address, detail: error.description)
        case MultiplexerError.keepAliveTimeout:
            self.init(.stalled, address: address, detail: "its keepalive ping went unanswered")
        case let error as MultiplexerError:
            self.init(.multiplexer(error), address: address)
        case let error as DeliveryIdleTimeout:
            self.init(.stalled, address: address, detail: error.description)
        case let error as DeliveryProtocolError:
            self.init(.delivery(error), address: address)
        case let error as NIOConnectionError:
            // One target (an IPv4 literal): its failure is the one that counts.
            if let first = error.connectionErrors.first {
                self.init(first.error, address: address)
            } else {
                self.init(.other, address: address, detail: "no address to connect to")
            }
        case let error as IOError:
            self.init(Self.reason(errno: error.errnoCode), address: address, detail: String(cString: strerror(error.errnoCode)))
        case let error as ChannelError:
            switch error {
            case .connectTimeout: self.init(.timedOut, address: address)
            case .ioOnClosedChannel, .alreadyClosed, .eof, .outputClosed, .inputClosed: self.init(.closed, address: address)
            default: self.init(.other, address: address, detail: "\(error)")
            }
        default:
            self.init(.other, address: address, detail: "\(error)")
        }
    }

    private static func reason(errno code: Int32) -> Reason {
        switch code {
        case ECONNREFUSED: .refused
        case ETIMEDOUT: .timedOut
        case ENETUNREACH, EHOSTUNREACH: .unreachable
        case ECONNRESET, EPIPE: .reset
        default: .other
        }
    }

    /// The failure in words.
    public var description: String {
        switch reason {
        case .refused: "connection refused by \(address)"
        case .timedOut: "no connection to \(address) within the connect timeout"
        case .unreachable: "\(address) is unreachable"
        case .reset: "connection to \(address) reset by the other side"
        case .closed: "\(address) closed the connection"
        case .tls: "PSK-TLS with \(address) failed: \(detail)"
        case .multiplexer(let error): "multiplexer with \(address) failed: \(error)"
        case .delivery(let error): "delivery with \(address) failed: \(error)"
        case .stalled: "the session with \(address) went silent (\(detail)) and was closed"
        case .relayClosed: "relay session with \(address) closed"
        case .cancelled: "connection with \(address) closed: this peer stopped"
        case .other: detail.isEmpty ? "connection to \(address) failed" : "connection to \(address) failed: \(detail)"
        }
    }
}
