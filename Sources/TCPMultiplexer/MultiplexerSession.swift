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
    /// inbound streams are refused. Call it from the channel's initializer (or with reads off), so that
    /// no byte of the peer arrives before the session is there.
    public static func configure(
        on channel: Channel, role: MultiplexerRole,
        configuration: MultiplexerConfiguration = MultiplexerConfiguration(),
        inboundStreamInitializer: MultiplexerHandler.StreamInitializer? = nil
    ) -> EventLoopFuture<MultiplexerSession> {
        configure(on: channel, role: role, configuration: configuration,
                  inboundStreamInitializer: inboundStreamInitializer, sessionEnded: nil)
    }

    /// ``configure(on:role:configuration:inboundStreamInitializer:)`` with `sessionEnded` called once,
    /// on the event loop, when the session ends.
    static func configure(
        on channel: Channel, role: MultiplexerRole, configuration: MultiplexerConfiguration,
        inboundStreamInitializer: MultiplexerHandler.StreamInitializer?,
        sessionEnded: (@Sendable () -> Void)?
    ) -> EventLoopFuture<MultiplexerSession> {
        onLoop(channel.eventLoop) {
            if let marks = configuration.underlyingWriteBufferWaterMark {
                // Not every channel has the option (embedded ones); the session works without it.
                try? channel.syncOptions?.setOption(.writeBufferWaterMark, value: marks)
            }
            let handler = MultiplexerHandler(role: role, configuration: configuration,
                                             inboundStreamInitializer: inboundStreamInitializer,
                                             sessionEnded: sessionEnded)
            try channel.pipeline.syncOperations.addHandler(handler)
            return channel.eventLoop.makeSucceededFuture(
                MultiplexerSession(channel: channel, configuration: configuration, handler: handler))
        }
    }

    /// Opens a stream. `initializer` configures its pipeline before the stream goes live; the future
    /// completes with the stream's channel. The peer may send the moment it accepts, and bytes reaching
    /// a pipeline before its handlers are dropped, so a stream that reads installs them in `initializer`,
    /// not after the future completes. `name` is sent in `thali-multiplex` open frames (ignored by yamux).
    public func openStream(name: String? = nil,
                           initializer: MultiplexerHandler.StreamInitializer? = nil) -> EventLoopFuture<Channel> {
        onLoop(channel.eventLoop) {
            self.handler.value.createStream(name: name, on: self.channel.eventLoop, initializer: initializer)
        }
    }

    /// Opens a stream whose `outputInitializer` makes an `Output` of its channel before it goes live.
    func openStream<Output: Sendable>(name: String?,
                                      outputInitializer: @escaping @Sendable (Channel) -> EventLoopFuture<Output>) -> EventLoopFuture<Output> {
        onLoop(channel.eventLoop) {
            self.handler.value.createStream(name: name, on: self.channel.eventLoop, initializer: outputInitializer)
        }
    }

    /// Measures the round-trip time with a yamux ping.
    public func ping() -> EventLoopFuture<TimeAmount> {
        onLoop(channel.eventLoop) { self.handler.value.ping(on: self.channel.eventLoop) }
    }

    /// Sends GoAway (yamux): the peer may open no new streams; streams already open continue.
    public func goAway() {
        _ = onLoop(channel.eventLoop) {
            self.handler.value.goAway()
            return self.channel.eventLoop.makeSucceededVoidFuture()
        }
    }

    /// Ends the session: GoAway (yamux), all streams closed, the channel closed.
    public func close() -> EventLoopFuture<Void> {
        onLoop(channel.eventLoop) {
            let promise = self.channel.eventLoop.makePromise(of: Void.self)
            self.handler.value.shutdown(promise: promise)
            return promise.futureResult
        }
    }

    /// A snapshot of the session's counters and per-stream flow-control state.
    public func metrics() -> EventLoopFuture<MultiplexerMetrics> {
        onLoop(channel.eventLoop) {
            self.channel.eventLoop.makeSucceededFuture(self.handler.value.currentMetrics())
        }
    }
}

/// Runs `body` on `loop`: at once when already there (so embedded channels need no `run()`), else
/// submitted to it.
private func onLoop<T: Sendable>(_ loop: EventLoop, _ body: @escaping @Sendable () throws -> EventLoopFuture<T>) -> EventLoopFuture<T> {
    if loop.inEventLoop {
        do { return try body() } catch { return loop.makeFailedFuture(error) }
    }
    return loop.flatSubmit {
        do { return try body() } catch { return loop.makeFailedFuture(error) }
    }
}
