import NIOCore

/// A multiplexer session on a channel: many streams over one byte stream. Safe to use from any
/// thread; the work happens on the channel's event loop.
///
/// ```swift
/// let session = try await MultiplexerSession.configure(on: channel, role: .client).get()
/// let stream = try await session.openStream { stream in stream.pipeline.addHandler(MyHandler()) }.get()
/// ```
public final class MultiplexerSession: Sendable {
    /// The underlying channel (a TCP connection, a relayed stream, ...).
    public let channel: Channel
    /// The session's configuration.
    public let configuration: MultiplexerConfiguration
    private let handler: NIOLoopBound<MultiplexerHandler>

    private init(channel: Channel, configuration: MultiplexerConfiguration, handler: MultiplexerHandler) {
        self.channel = channel
        self.configuration = configuration
        self.handler = NIOLoopBound(handler, eventLoop: channel.eventLoop)
    }

    /// Adds a session handler at the end of `channel`'s pipeline. `inboundStreamInitializer` sets up
    /// each stream the peer opens (its future must succeed for the stream to go live); without one,
    /// inbound streams are refused.
    public static func configure(
        on channel: Channel, role: MultiplexerRole,
        configuration: MultiplexerConfiguration = MultiplexerConfiguration(),
        inboundStreamInitializer: MultiplexerHandler.StreamInitializer? = nil
    ) -> EventLoopFuture<MultiplexerSession> {
        channel.eventLoop.submit {
            let handler = MultiplexerHandler(role: role, configuration: configuration,
                                             inboundStreamInitializer: inboundStreamInitializer)
            try channel.pipeline.syncOperations.addHandler(handler)
            return MultiplexerSession(channel: channel, configuration: configuration, handler: handler)
        }
    }

    /// Opens a stream. `initializer` configures its pipeline before the stream goes live; the future
    /// completes with the stream's channel. `name` is sent in `thali-multiplex` open frames (ignored by yamux).
    public func openStream(name: String? = nil,
                           initializer: MultiplexerHandler.StreamInitializer? = nil) -> EventLoopFuture<Channel> {
        let loop = channel.eventLoop
        if loop.inEventLoop {
            return handler.value.createStream(name: name, on: loop, initializer: initializer)
        }
        return loop.flatSubmit {
            self.handler.value.createStream(name: name, on: loop, initializer: initializer)
        }
    }

    /// Measures the round-trip time with a yamux ping.
    public func ping() -> EventLoopFuture<TimeAmount> {
        channel.eventLoop.flatSubmit { self.handler.value.ping(on: self.channel.eventLoop) }
    }

    /// Sends GoAway (yamux): the peer may open no new streams; streams already open continue.
    public func goAway() {
        channel.eventLoop.execute { self.handler.value.goAway() }
    }

    /// Ends the session: GoAway (yamux), all streams closed, the channel closed.
    public func close() -> EventLoopFuture<Void> {
        channel.eventLoop.flatSubmit {
            self.handler.value.shutdown()
            return self.channel.closeFuture
        }
    }

    /// A snapshot of the session's counters and per-stream flow-control state.
    public func metrics() -> EventLoopFuture<MultiplexerMetrics> {
        channel.eventLoop.submit { self.handler.value.currentMetrics() }
    }
}
