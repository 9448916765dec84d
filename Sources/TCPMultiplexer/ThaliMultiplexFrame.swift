import NIOCore
import ThaliMutants

/// A `thali-multiplex` frame header: `uvarint(id << 3 | flag) uvarint(length)` (unsigned LEB128), the
/// format of npm `multiplex` 6.7.0 (= libp2p mplex). Each stream is named by its id *and* by which side
/// opened it: the opener's frames carry the "initiator" flags, the other side's the "receiver" ones, so
/// both sides may use the same id for different streams.
public struct ThaliMultiplexHeader: Hashable, Sendable {
    /// The seven frame kinds.
    public enum Flag: UInt8, Sendable {
        /// Opens a stream; the body is the stream's name (empty: the receiver names it by its id).
        case open = 0
        /// Data sent by the side that accepted the stream.
        case messageReceiver = 1
        /// Data sent by the side that opened the stream.
        case messageInitiator = 2
        /// The accepting side ends its direction (half-close).
        case closeReceiver = 3
        /// The opening side ends its direction (half-close).
        case closeInitiator = 4
        /// The accepting side aborts the stream; the body may hold an error message.
        case resetReceiver = 5
        /// The opening side aborts the stream; the body may hold an error message.
        case resetInitiator = 6

        /// Whether the frame comes from the side that opened the stream.
        public var fromInitiator: Bool {
            switch self {
            case .open, .messageInitiator, .closeInitiator, .resetInitiator: return true
            case .messageReceiver, .closeReceiver, .resetReceiver: return false
            }
        }

        /// The frame kinds, independent of side.
        public enum Kind: Sendable {
            /// Opens a stream (its payload is the stream's name).
            case open
            /// Carries stream data.
            case message
            /// Half-closes the sender's direction.
            case close
            /// Aborts the stream in both directions.
            case reset
        }

        /// The frame kind, independent of side.
        public var kind: Kind {
            switch self {
            case .open: return .open
            case .messageReceiver, .messageInitiator: return .message
            case .closeReceiver, .closeInitiator: return .close
            case .resetReceiver, .resetInitiator: return .reset
            }
        }

        /// The flag of `kind` sent by the opener (`fromInitiator`) or by the acceptor.
        public init(kind: Kind, fromInitiator: Bool) {
            switch kind {
            case .open: self = .open
            case .message: self = fromInitiator ? .messageInitiator : .messageReceiver
            case .close: self = fromInitiator ? .closeInitiator : .closeReceiver
            case .reset: self = fromInitiator ? .resetInitiator : .resetReceiver
            }
        }
    }

    /// The most bytes an unsigned 64-bit LEB128 varint may take; a longer one is an error.
    public static let maxVarintLength = 10
    /// The largest stream id: the id is shifted left by 3 inside a 64-bit varint.
    public static let maxStreamID: UInt64 = UInt64.max >> 3

    /// The stream id (its opener's number for it).
    public var streamID: UInt64
    /// The frame kind and the sender's side.
    public var flag: Flag
    /// The body length.
    public var length: Int

    /// A header; `streamID` must be at most ``maxStreamID`` and `length` not negative.
    public init(streamID: UInt64, flag: Flag, length: Int) {
        precondition(streamID <= Self.maxStreamID && length >= 0)
        self.streamID = streamID
        self.flag = flag
        self.length = length
    }

    /// Appends the encoded header to `buffer`.
    public func write(to buffer: inout ByteBuffer) {
        Self.writeVarint(streamID << 3 | UInt64(flag.rawValue), to: &buffer)
        Self.writeVarint(UInt64(length), to: &buffer)
    }

    /// Appends `value` as an unsigned LEB128 varint.
    public static func writeVarint(_ value: UInt64, to buffer: inout ByteBuffer) {
        var value = value
        while value >= 0x80 {
            buffer.writeInteger(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        buffer.writeInteger(UInt8(value))
    }

    /// Reads a varint at `offset` bytes past the reader index: the value and its encoded size, or `nil`
    /// if the readable bytes end inside it.
    static func peekVarint(_ buffer: ByteBuffer, offset: Int) throws(MultiplexerError) -> (UInt64, Int)? {
        var value: UInt64 = 0
        let longest = Mutant.thaliMultiplexLongVarints.isActive ? maxVarintLength + 1 : maxVarintLength
        for index in 0..<longest {
            guard let byte = buffer.getInteger(at: buffer.readerIndex + offset + index, as: UInt8.self) else {
                return nil
            }
            let bits = UInt64(byte & 0x7f)
            // The tenth byte may only hold the 64th bit.
            if index == maxVarintLength - 1 && bits > 1 && !Mutant.thaliMultiplexLongVarints.isActive { throw .varintTooLong }
            value |= bits << (7 * UInt64(index))
            if byte & 0x80 == 0 { return (value, index + 1) }
        }
        throw .varintTooLong
    }

    /// Reads a header from `buffer` (advancing it); `nil`, with `buffer` untouched, if it is incomplete.
    public static func read(from buffer: inout ByteBuffer, maxLength: Int) throws(MultiplexerError) -> ThaliMultiplexHeader? {
        guard let (tag, tagSize) = try peekVarint(buffer, offset: 0) else { return nil }
        guard let rawFlag = UInt8(exactly: tag & 7), let flag = Flag(rawValue: rawFlag) else {
            throw .unknownFlag(tag & 7)
        }
        guard let (length, lengthSize) = try peekVarint(buffer, offset: tagSize) else { return nil }
        guard length <= UInt64(maxLength) else { throw .frameTooLarge(length: length, limit: maxLength) }
        buffer.moveReaderIndex(forwardBy: tagSize + lengthSize)
        return ThaliMultiplexHeader(streamID: tag >> 3, flag: flag, length: Int(length))
    }
}

/// Splits the bytes of a `thali-multiplex` connection into frames, however they were cut into reads.
/// Message payloads are handed out as slices of the reads as they arrive; the bodies of open and reset
/// frames (a name, an error message) are gathered whole, up to ``maxControlBodyLength``.
public struct ThaliMultiplexFrameDecoder: Sendable {
    /// What the decoder found next.
    public enum Event: Hashable, Sendable {
        /// A frame header. For message frames `body` is `nil` and `.data` pieces totalling `length`
        /// follow; for other frames `body` holds the whole body.
        case header(ThaliMultiplexHeader, body: ByteBuffer?)
        /// The next piece of the current message frame's payload.
        case data(ByteBuffer)
    }

    /// The default largest frame payload: 1 MiB.
    public static let defaultMaxPayloadLength = 1 << 20
    /// The largest body of an open (stream name) or reset (error message) frame: 64 KiB.
    public static let maxControlBodyLength = 64 * 1024
    /// The longest a header can be: two varints.
    static let maxHeaderLength = 2 * ThaliMultiplexHeader.maxVarintLength

    /// The largest payload accepted in one frame.
    public let maxPayloadLength: Int
    private var buffer = ByteBuffer()
    private var carry = ByteBuffer()
    private var payloadRemaining = 0
    private var pendingControl: ThaliMultiplexHeader?

    /// Creates a decoder that refuses frames longer than `maxPayloadLength`.
    public init(maxPayloadLength: Int = ThaliMultiplexFrameDecoder.defaultMaxPayloadLength) {
        self.maxPayloadLength = maxPayloadLength
    }

    /// Whether part of a frame (a header's first bytes, a control body, or payload still to come) has
    /// been fed.
    public var isMidFrame: Bool {
        payloadRemaining > 0 || pendingControl != nil || carry.readableBytes > 0 || buffer.readableBytes > 0
    }

    /// Adds received bytes; call ``next()`` until it returns `nil` before feeding more.
    public mutating func feed(_ bytes: ByteBuffer) {
        if buffer.readableBytes == 0 {
            buffer = bytes
        } else {
            var bytes = bytes
            buffer.writeBuffer(&bytes)
        }
    }

    /// The next header or payload piece, `nil` when more bytes are needed.
    public mutating func next() throws(MultiplexerError) -> Event? {
        if let control = pendingControl {
            // Gather the whole body of an open/reset/close frame.
            let take = min(control.length - carry.readableBytes, buffer.readableBytes)
            if take > 0, var piece = buffer.readSlice(length: take) { carry.writeBuffer(&piece) }
            guard carry.readableBytes == control.length else { return nil }
            let body = carry
            carry = ByteBuffer()
            pendingControl = nil
            return .header(control, body: body)
        }
        if payloadRemaining > 0 {
            let count = min(payloadRemaining, buffer.readableBytes)
            guard count > 0, let piece = buffer.readSlice(length: count) else { return nil }
            payloadRemaining -= count
            return .data(piece)
        }
        let header: ThaliMultiplexHeader
        if carry.readableBytes == 0, let parsed = try ThaliMultiplexHeader.read(from: &buffer, maxLength: maxPayloadLength) {
            header = parsed
        } else {
            // A header split across reads: top up the carried bytes, parse, and give back what the
            // header did not use (those bytes came from the front of `buffer`).
            let before = carry.readableBytes
            let take = min(Self.maxHeaderLength - before, buffer.readableBytes)
            if take > 0, var piece = buffer.readSlice(length: take) { carry.writeBuffer(&piece) }
            guard let parsed = try ThaliMultiplexHeader.read(from: &carry, maxLength: maxPayloadLength) else {
                return nil
            }
            buffer.moveReaderIndex(to: buffer.readerIndex - carry.readableBytes)
            carry.clear()
            header = parsed
        }
        switch header.flag.kind {
        case .message:
            payloadRemaining = header.length
            return .header(header, body: nil)
        case .open, .close, .reset:
            guard header.length <= Self.maxControlBodyLength || Mutant.thaliMultiplexUnboundedControlBodies.isActive else {
                throw .frameTooLarge(length: UInt64(header.length), limit: Self.maxControlBodyLength)
            }
            pendingControl = header
            return try next()
        }
    }
}
