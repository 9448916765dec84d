import NIOCore

/// A stream between this node and a contact for an app's own protocol, in process: what
/// ``ThaliPeer/openStream(to:protocol:timeout:)`` returns and ``ThaliPeer/handleStreams(protocol:)``
/// yields. Use it inside ``withStream(isolation:_:)``: read the bytes as they arrive, write with the
/// writer. Finishing the writer (``PeerStreamWriter/finish()``) half-closes the stream: the other side's
/// reads end and it may still answer. Leaving `withStream` closes the stream in order, as a TCP close
/// does: what was written arrives, then the end (``PeerStreamConfiguration/closeLinger``). On the opening
/// side, a stream the contact's node does not serve fails its first read with a ``StreamRefusal`` (and
/// ``PeerEvent/streamRefused(contact:role:kind:refusal:byThisNode:)`` says so on both nodes).
public struct PeerStream: Sendable {
    /// The contact at the other end, as the PSK-TLS handshake authenticated it.
    public let contact: String
    /// The app protocol (`chat` for streams of kind `app/chat`).
    public let protocolName: String
    /// The multiplexer stream underneath, for the suite's own modules.
    package let channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>

    package init(contact: String, protocolName: String, channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>) {
        self.contact = contact
        self.protocolName = protocolName
        self.channel = channel
    }

    /// Runs `body` with the stream's inbound bytes and a writer, then closes the stream in order (what
    /// was written arrives before the end), whether `body` returned or threw. Use a stream once.
    public func withStream<Result>(
        isolation: isolated (any Actor)? = #isolation,
        _ body: (_ inbound: PeerStreamInbound, _ outbound: PeerStreamWriter) async throws -> sending Result
    ) async throws -> sending Result {
        try await channel.executeThenClose { inbound, outbound in
            try await body(PeerStreamInbound(base: inbound), PeerStreamWriter(base: outbound))
        }
    }
}

/// The bytes a contact sends on a ``PeerStream``, in chunks as they arrive; the sequence ends at the
/// contact's half-close and throws when the stream fails (a reset, a ``StreamRefusal``).
public struct PeerStreamInbound: AsyncSequence, Sendable {
    /// A chunk of bytes, as it arrived.
    public typealias Element = [UInt8]

    let base: NIOAsyncChannelInboundStream<ByteBuffer>

    /// The iterator of ``PeerStreamInbound``.
    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator

        /// The next chunk; nil at the contact's half-close.
        public mutating func next() async throws -> [UInt8]? {
            guard let buffer = try await base.next() else { return nil }
            return Array(buffer.readableBytesView)
        }
    }

    /// Starts reading.
    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: base.makeAsyncIterator())
    }
}

/// Writes to a contact over a ``PeerStream``. Writes wait while the contact's window is full (the stream
/// is flow-controlled), so a fast writer cannot fill memory.
public struct PeerStreamWriter: Sendable {
    let base: NIOAsyncChannelOutboundWriter<ByteBuffer>

    /// Sends `bytes`; throws once the stream has failed or this side has finished.
    public func write(_ bytes: some Sequence<UInt8>) async throws {
        try await base.write(ByteBuffer(bytes: bytes))
    }

    /// Sends `text` as UTF-8.
    public func write(_ text: String) async throws {
        try await base.write(ByteBuffer(string: text))
    }

    /// Half-closes: this side sends nothing more and the contact's reads end; reading goes on.
    public func finish() {
        base.finish()
    }
}
