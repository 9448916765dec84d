import NIOCore

/// A multiplexer session used from async code, in the manner of NIO's async bootstraps and
/// `configureAsyncHTTP2Pipeline`: streams the peer opens arrive on ``inbound`` as whatever the inbound
/// initializer made of them (by default a `NIOAsyncChannel`), and ``openStream(name:configuration:)``
/// opens one.
///
/// ```swift
/// let mux = try await MultiplexerSession.configureAsync(on: connection, role: .server).get()
/// for try await stream in mux.inbound {
///     try await stream.executeThenClose { inbound, outbound in
///         for try await bytes in inbound { try await outbound.write(bytes) }
///     }
/// }
/// ```
public struct MultiplexerAsyncSession<Inbound: Sendable>: Sendable {
    /// The session (ping, GoAway, close, metrics, and the future-based API).
    public let session: MultiplexerSession
    /// The streams the peer opens, in order; it ends when the session ends (its channel closed, a fatal
    /// error, or ``MultiplexerSession/close()``).
    public let inbound: MultiplexerInboundStreams<Inbound>

    /// Opens a stream as a `NIOAsyncChannel` of bytes. The peer's FIN ends its inbound sequence;
    /// finishing its outbound writer sends our FIN (with the default `configuration`).
    public func openStream(
        name: String? = nil,
        configuration: NIOAsyncChannel<ByteBuffer, ByteBuffer>.Configuration = .init(isOutboundHalfClosureEnabled: true)
    ) async throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
        try await session.openAsyncStream(name: name, configuration: configuration)
    }

    /// Opens a stream whose `initializer` turns the channel into `Output` (runs on its event loop before
    /// the stream goes live).
    public func openStream<Output: Sendable>(
        name: String? = nil,
        initializer: @escaping @Sendable (Channel) -> EventLoopFuture<Output>
    ) async throws -> Output {
        try await session.openAsyncStream(name: name, initializer: initializer)
    }
}

/// The streams the peer opens on a ``MultiplexerAsyncSession``, as an async sequence. It holds at most
/// ``MultiplexerConfiguration/maxConcurrentStreams`` streams not yet taken; a stream that finds it full
/// (or no one iterating any more) is reset.
public struct MultiplexerInboundStreams<Output: Sendable>: AsyncSequence, Sendable {
    public typealias Element = Output

    private let stream: AsyncThrowingStream<Output, Error>

    init(_ stream: AsyncThrowingStream<Output, Error>) {
        self.stream = stream
    }

    /// Iterates the inbound streams.
    public struct AsyncIterator: AsyncIteratorProtocol {
        private var base: AsyncThrowingStream<Output, Error>.AsyncIterator

        init(_ base: AsyncThrowingStream<Output, Error>.AsyncIterator) {
            self.base = base
        }

        /// The next stream the peer opened, `nil` once the session has ended.
        public mutating func next() async throws -> Output? {
            try await base.next()
        }
    }

    /// An iterator over the inbound streams.
    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(stream.makeAsyncIterator())
    }
}

extension MultiplexerSession {
    /// Adds a session handler to `channel` (as ``configure(on:role:configuration:inboundStreamInitializer:)``
    /// does) whose inbound streams arrive as `NIOAsyncChannel`s on ``MultiplexerAsyncSession/inbound``:
    /// the peer's FIN ends a stream's inbound sequence, and finishing its outbound writer sends our FIN
    /// (with the default `streamConfiguration`). Call it from the channel's initializer, as NIO's async
    /// bootstraps do: `ClientBootstrap(...).connect(host:port:) { MultiplexerSession.configureAsync(on: $0, role: .client) }`.
    public static func configureAsync(
        on channel: Channel, role: MultiplexerRole,
        configuration: MultiplexerConfiguration = MultiplexerConfiguration(),
        streamConfiguration: NIOAsyncChannel<ByteBuffer, ByteBuffer>.Configuration = .init(isOutboundHalfClosureEnabled: true)
    ) -> EventLoopFuture<MultiplexerAsyncSession<NIOAsyncChannel<ByteBuffer, ByteBuffer>>> {
        configureAsync(on: channel, role: role, configuration: configuration) { stream in
            stream.eventLoop.makeCompletedFuture { try wrapAsync(stream, configuration: streamConfiguration) }
        }
    }

    /// Adds a session handler to `channel` whose inbound streams are turned into `Inbound` by
    /// `inboundStreamInitializer` (on the stream's event loop, before it goes live) and arrive on
    /// ``MultiplexerAsyncSession/inbound``.
    public static func configureAsync<Inbound: Sendable>(
        on channel: Channel, role: MultiplexerRole,
        configuration: MultiplexerConfiguration = MultiplexerConfiguration(),
        inboundStreamInitializer: @escaping @Sendable (Channel) -> EventLoopFuture<Inbound>
    ) -> EventLoopFuture<MultiplexerAsyncSession<Inbound>> {
        // Every stream waiting here is open, so the session's stream limit bounds the buffer.
        let (streams, continuation) = AsyncThrowingStream.makeStream(
            of: Inbound.self, throwing: Error.self,
            bufferingPolicy: .bufferingOldest(max(1, configuration.maxConcurrentStreams)))
        // The sequence ends when the session does, not when the channel's close future completes: that
        // may come later (an embedded channel's only on `run()`), and a session can end while its
        // channel stays open (its handler removed).
        return configure(on: channel, role: role, configuration: configuration, inboundStreamInitializer: { stream in
            inboundStreamInitializer(stream).flatMapThrowing { output in
                guard case .enqueued = continuation.yield(output) else { throw MultiplexerError.tooManyStreams(limit: configuration.maxConcurrentStreams) }
            }
        }, sessionEnded: { continuation.finish() }).map { session in
            MultiplexerAsyncSession(session: session, inbound: MultiplexerInboundStreams(streams))
        }
    }

    /// Opens a stream as a `NIOAsyncChannel` of bytes. The peer's FIN ends its inbound sequence;
    /// finishing its outbound writer sends our FIN.
    public func openAsyncStream(
        name: String? = nil,
        configuration: NIOAsyncChannel<ByteBuffer, ByteBuffer>.Configuration = .init(isOutboundHalfClosureEnabled: true)
    ) async throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
        try await openAsyncStream(name: name) { stream in
            stream.eventLoop.makeCompletedFuture { try Self.wrapAsync(stream, configuration: configuration) }
        }
    }

    /// Opens a stream whose `initializer` turns the channel into `Output` (on its event loop, before the
    /// stream goes live), and returns that.
    public func openAsyncStream<Output: Sendable>(
        name: String? = nil,
        initializer: @escaping @Sendable (Channel) -> EventLoopFuture<Output>
    ) async throws -> Output {
        try await openStream(name: name, outputInitializer: initializer).get()
    }

    private static func wrapAsync(_ stream: Channel, configuration: NIOAsyncChannel<ByteBuffer, ByteBuffer>.Configuration)
        throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
        try stream.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
        return try NIOAsyncChannel(wrappingChannelSynchronously: stream, configuration: configuration)
    }
}
