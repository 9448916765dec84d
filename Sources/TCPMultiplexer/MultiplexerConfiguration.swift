import NIOCore

/// The wire format a multiplexer session speaks. Both ends of a session must use the same one.
public enum MultiplexerFraming: String, Sendable, Hashable, CaseIterable {
    /// hashicorp/yamux version 0: 12-byte headers, per-stream flow-control windows, pings and GoAway.
    /// The default: a slow reader on one stream cannot stall the others.
    case yamux
    /// The npm `multiplex` 6.7.0 format Thali deployed (the same as libp2p mplex). It has no flow control,
    /// so every receive buffer is bounded and a stream that overflows its buffer is reset.
    case thaliMultiplex = "thali-multiplex"
}

/// Which end of the underlying connection a session is. In yamux the client opens odd stream ids and the
/// server even ones; in `thali-multiplex` the role does not appear on the wire.
public enum MultiplexerRole: Sendable, Hashable {
    /// The end that made the underlying connection.
    case client
    /// The end that accepted the underlying connection.
    case server
}

/// Every limit and timer of a session, with its default. Limits protect the session from a peer that
/// misbehaves: exceeding one is a typed ``MultiplexerError`` and a stream reset or a GoAway, never an
/// unbounded buffer.
public struct MultiplexerConfiguration: Sendable {
    /// The wire format. Default: ``MultiplexerFraming/yamux``.
    public var framing: MultiplexerFraming = .yamux

    /// Most streams open at once (both directions together). A stream opened by the peer beyond this is
    /// reset at once; a local open beyond it fails with ``MultiplexerError/tooManyStreams(limit:)``.
    /// Default 1024.
    public var maxConcurrentStreams: Int = 1024

    /// Most streams opened by the peer whose initializer has not completed yet (yamux's accept backlog).
    /// Beyond it a new inbound stream is reset. Default 256, as in hashicorp/yamux.
    public var acceptBacklog: Int = 256

    /// The largest frame payload accepted from the peer and the largest one sent. For yamux data frames
    /// the receive window bounds a frame anyway; this caps `thali-multiplex` frames, whose length comes
    /// from the peer. Default 1 MiB (``ThaliMultiplexFrameDecoder/defaultMaxPayloadLength``).
    public var maxFrameSize: Int = 1 << 20

    /// The payload size of the data frames this end sends: big frames mean fewer headers and syscalls,
    /// small ones mean fairer interleaving between streams. Default 256 KiB.
    public var sendChunkSize: Int = 256 * 1024

    /// yamux: the largest receive window one stream may grow to by auto-tuning. Windows start at
    /// 256 KiB (the protocol's fixed initial window) and double while the reader keeps up and the
    /// window turns over faster than a few round trips. Default 16 MiB.
    public var maxStreamWindowSize: Int = 16 << 20

    /// Upper bound on the bytes received but not yet read by the streams' channels, over the whole
    /// session. yamux: windows stop growing beyond the initial 256 KiB when granting more would pass this
    /// bound (the initial window per stream is part of the protocol, so the hard bound is
    /// `max(this, maxConcurrentStreams × 256 KiB)`). `thali-multiplex`: a frame that would pass it resets
    /// its stream. Default 64 MiB.
    public var maxSessionReceiveBuffer: Int = 64 << 20

    /// `thali-multiplex`: the bytes one stream may hold unread before it is reset (that framing has no
    /// flow control). Default 4 MiB.
    public var maxStreamReceiveBuffer: Int = 4 << 20

    /// `thali-multiplex`: how many ids of our ended streams may wait before they are used again. That
    /// framing reuses the lowest free id and acknowledges nothing: what the peer sent before it saw our
    /// reset, or a reset of its own that crossed our close, would otherwise land on the next stream we
    /// open with that id. An id leaves the quarantine when the peer's reset for it arrives (nothing of
    /// the old stream can follow), or, oldest first, when more than this many wait; a stream the peer
    /// reset is not quarantined. Default 256.
    public var maxQuarantinedStreamIDs: Int = 256

    /// Bytes a stream's channel may queue for sending before it reports itself not writable. Default
    /// 256 KiB; it becomes writable again below half of that.
    public var streamWriteBufferHighWatermark: Int = 256 * 1024

    /// The write-buffer water marks the session sets on its underlying channel, or `nil` to leave the
    /// channel's own. The session stops sending stream data while the channel is not writable; NIO's
    /// default marks (32/64 KiB) would make it wait for every 256 KiB frame to drain. Default 1 MiB /
    /// 4 MiB.
    public var underlyingWriteBufferWaterMark: ChannelOptions.Types.WriteBufferWaterMark? =
        .init(low: 1 << 20, high: 4 << 20)

    /// yamux: how often to send a keepalive ping, or `nil` for none. Default 30 s, as in hashicorp/yamux.
    public var keepAliveInterval: Duration? = .seconds(30)

    /// yamux: how long a ping may stay unanswered before the session is closed with
    /// ``MultiplexerError/keepAliveTimeout``. Default 30 s.
    public var keepAliveTimeout: Duration = .seconds(30)

    /// How long a session may have no open stream before it sends GoAway and closes; `nil` for never.
    /// Default `nil` (a Thali relay stays up while its transport does).
    public var idleTimeout: Duration? = nil

    /// Creates a configuration with every default, for `framing`.
    public init(framing: MultiplexerFraming = .yamux) {
        self.framing = framing
    }
}
