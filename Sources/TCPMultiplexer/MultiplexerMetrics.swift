/// Counters of a session, for tests and monitoring (``MultiplexerSession/metrics()``).
public struct MultiplexerMetrics: Sendable, Hashable {
    /// One stream's flow-control state.
    public struct Stream: Sendable, Hashable {
        /// The stream id on the wire.
        public var streamID: UInt64
        /// Whether this side opened the stream.
        public var isLocallyInitiated: Bool
        /// Bytes received and not yet read by the stream's channel. For yamux never above
        /// `receiveWindow`.
        public var bufferedReceiveBytes: Int
        /// yamux: the receive window currently granted to the peer (grows by auto-tuning).
        public var receiveWindow: Int
        /// yamux: bytes this side may still send.
        public var sendWindow: Int
        /// Bytes the stream's channel wrote that are not yet handed to the underlying channel.
        public var queuedSendBytes: Int
    }

    /// Streams open now.
    public var openStreams = 0
    /// Bytes received on all streams and not yet read.
    public var bufferedReceiveBytes = 0
    /// Per-stream state, in no particular order.
    public var streams: [Stream] = []
    /// Streams this side opened.
    public var streamsOpenedLocally = 0
    /// Streams the peer opened that were accepted.
    public var streamsAccepted = 0
    /// Inbound streams refused (limits, backlog, GoAway, no initializer).
    public var streamsRefused = 0
    /// Frames decoded.
    public var framesReceived = 0
    /// Bytes read from the underlying channel.
    public var bytesReceived = 0
    /// Bytes written to the underlying channel (headers included).
    public var bytesSent = 0
    /// Payload bytes sent on streams.
    public var bytesSentOnStreams = 0
    /// yamux window updates sent.
    public var windowUpdatesSent = 0
    /// Times auto-tuning doubled a stream's receive window.
    public var windowGrowths = 0
    /// Streams this side reset (refusals included).
    public var resetsSent = 0
    /// Streams the peer reset.
    public var resetsReceived = 0
    /// `thali-multiplex` streams reset because their receive buffer overflowed.
    public var overflowResets = 0
    /// Normal GoAways received.
    public var goAwaysReceived = 0
    /// Sessions ended because the peer broke the protocol.
    public var protocolErrors = 0
}
