/// Why a session or a stream failed. Errors caused by the peer carry enough context to log.
public enum MultiplexerError: Error, Hashable, Sendable, CustomStringConvertible {
    /// yamux header with a version other than 0.
    case unsupportedVersion(UInt8)
    /// yamux header with an unknown message type.
    case unknownFrameType(UInt8)
    /// `thali-multiplex` header with a flag value above 6.
    case unknownFlag(UInt64)
    /// A varint longer than ``ThaliMultiplexHeader/maxVarintLength`` bytes or overflowing 64 bits.
    case varintTooLong
    /// A frame whose payload length passes the configured maximum.
    case frameTooLarge(length: UInt64, limit: Int)
    /// A stream id the framing cannot carry, or one the peer may not use (wrong parity, zero).
    case invalidStreamID(UInt64)
    /// The peer opened a stream id that is already open.
    case duplicateStream(UInt64)
    /// The peer sent more data than the window it was granted.
    case receiveWindowExceeded(streamID: UInt64, window: Int, length: Int)
    /// The peer raised a stream's send window past 2³²−1.
    case sendWindowOverflow(streamID: UInt64)
    /// A frame with flags that make no sense in the stream's state (for example data after FIN).
    case unexpectedFrame(streamID: UInt64, reason: String)
    /// A GoAway, ping or window update that breaks the rules of its type.
    case invalidControlFrame(reason: String)
    /// The peer sent GoAway with an error code (0 is a normal GoAway and is not an error).
    case remoteGoAway(code: UInt32)
    /// The session no longer accepts new streams (a GoAway was sent or received).
    case goingAway
    /// A stream could not be opened: the concurrent-stream limit is reached.
    case tooManyStreams(limit: Int)
    /// Stream ids of this side are used up.
    case streamIDsExhausted
    /// The peer reset the stream; `thali-multiplex` resets may carry a message.
    case streamReset(message: String?)
    /// A `thali-multiplex` stream received more unread data than its buffer may hold and was reset.
    case receiveBufferOverflow(streamID: UInt64, limit: Int)
    /// The peer did not answer a keepalive ping in time.
    case keepAliveTimeout
    /// The session had no stream for the idle timeout and was closed.
    case idleTimeout
    /// The underlying channel closed (or the session was shut down) while the stream was open.
    case sessionClosed
    /// The underlying channel's input ended (the peer half-closed the connection, or its TLS
    /// close_notify arrived), so no frame can come any more and the session ended; `midFrame`: the
    /// input ended inside a frame (a truncated frame, a protocol error).
    case inputEnded(midFrame: Bool)
    /// The stream's output is already closed, so it cannot write.
    case outputClosed
    /// The peer caused more control frames (refusals, resets) than may queue while it does not read.
    case controlFrameBacklog(limit: Int)
    /// An operation was used on the wrong kind of session (for example a ping in `thali-multiplex`).
    case unsupported(String)

    public var description: String {
        switch self {
        case .unsupportedVersion(let v): return "unsupported yamux version \(v)"
        case .unknownFrameType(let t): return "unknown yamux frame type \(t)"
        case .unknownFlag(let f): return "unknown thali-multiplex flag \(f)"
        case .varintTooLong: return "varint too long"
        case .frameTooLarge(let length, let limit): return "frame of \(length) bytes exceeds limit \(limit)"
        case .invalidStreamID(let id): return "invalid stream id \(id)"
        case .duplicateStream(let id): return "duplicate stream id \(id)"
        case .receiveWindowExceeded(let id, let window, let length):
            return "stream \(id): \(length) bytes received with a window of \(window)"
        case .sendWindowOverflow(let id): return "stream \(id): send window overflow"
        case .unexpectedFrame(let id, let reason): return "stream \(id): unexpected frame (\(reason))"
        case .invalidControlFrame(let reason): return "invalid control frame: \(reason)"
        case .remoteGoAway(let code): return "peer sent GoAway with error code \(code)"
        case .goingAway: return "session is going away"
        case .tooManyStreams(let limit): return "concurrent stream limit \(limit) reached"
        case .streamIDsExhausted: return "stream ids exhausted"
        case .streamReset(let message): return "stream reset by peer" + (message.map { ": \($0)" } ?? "")
        case .receiveBufferOverflow(let id, let limit): return "stream \(id): receive buffer over \(limit) bytes"
        case .keepAliveTimeout: return "keepalive ping unanswered"
        case .idleTimeout: return "session idle timeout"
        case .sessionClosed: return "session closed"
        case .inputEnded(let midFrame):
            return midFrame ? "the connection's input ended in the middle of a frame"
                            : "the peer ended its side of the connection"
        case .outputClosed: return "stream output closed"
        case .controlFrameBacklog(let limit): return "peer caused over \(limit) bytes of control frames without reading"
        case .unsupported(let what): return "unsupported: \(what)"
        }
    }
}
