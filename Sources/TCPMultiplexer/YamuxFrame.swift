import NIOCore
import ThaliMutants

/// A yamux frame header (hashicorp/yamux `spec.md`, version 0): 12 bytes, big-endian —
/// version (1), type (1), flags (2), stream id (4), length (4). For data frames `length` is the payload
/// size; for window updates the window delta; for pings an opaque value echoed back; for GoAway the
/// error code.
public struct YamuxHeader: Hashable, Sendable {
    /// The frame types of version 0.
    public enum FrameType: UInt8, Sendable {
        /// Payload bytes for a stream; `length` bytes follow the header.
        case data = 0
        /// Adds `length` bytes to the receiver's send window for the stream (may open/close it via flags).
        case windowUpdate = 1
        /// Keepalive / round-trip probe on stream 0; answered with ACK and the same `length`.
        case ping = 2
        /// Ends the session on stream 0; `length` is a ``YamuxHeader/GoAwayCode``.
        case goAway = 3
    }

    /// Stream control flags; any frame type but GoAway may carry them.
    public struct Flags: OptionSet, Hashable, Sendable {
        public let rawValue: UInt16
        public init(rawValue: UInt16) { self.rawValue = rawValue }
        /// Opens a stream (or asks for a ping answer).
        public static let syn = Flags(rawValue: 1)
        /// Acknowledges a stream (or answers a ping).
        public static let ack = Flags(rawValue: 2)
        /// Half-closes the sender's direction of the stream.
        public static let fin = Flags(rawValue: 4)
        /// Aborts the stream in both directions.
        public static let rst = Flags(rawValue: 8)
    }

    /// GoAway error codes.
    public enum GoAwayCode: UInt32, Sendable {
        /// Normal termination: no new streams, existing ones may finish.
        case normal = 0
        /// The sender saw a protocol error.
        case protocolError = 1
        /// The sender had an internal error.
        case internalError = 2
    }

    /// The encoded size of a header.
    public static let size = 12
    /// The only version this implementation speaks.
    public static let version: UInt8 = 0
    /// The window every stream starts with in both directions, fixed by the protocol: 256 KiB.
    public static let initialWindowSize = 256 * 1024

    /// What the frame is.
    public var type: FrameType
    /// Stream control flags.
    public var flags: Flags
    /// The stream; 0 for pings and GoAway.
    public var streamID: UInt32
    /// Payload length (data), window delta (window update), opaque value (ping) or code (GoAway).
    public var length: UInt32

    /// A header with the given fields (the version is always 0).
    public init(type: FrameType, flags: Flags = [], streamID: UInt32, length: UInt32) {
        self.type = type
        self.flags = flags
        self.streamID = streamID
        self.length = length
    }

    /// Appends the 12 encoded bytes to `buffer`.
    public func write(to buffer: inout ByteBuffer) {
        buffer.writeMultipleIntegers(Self.version, type.rawValue, flags.rawValue, streamID, length)
    }

    /// Reads a header from the first 12 readable bytes of `buffer`; `nil` if fewer are readable.
    public static func read(from buffer: inout ByteBuffer) throws(MultiplexerError) -> YamuxHeader? {
        guard let (version, rawType, rawFlags, streamID, length) =
            buffer.getMultipleIntegers(at: buffer.readerIndex, as: (UInt8, UInt8, UInt16, UInt32, UInt32).self)
        else { return nil }
        guard version == Self.version || Mutant.yamuxAcceptsAnyVersion.isActive else { throw .unsupportedVersion(version) }
        guard let type = FrameType(rawValue: rawType) else { throw .unknownFrameType(rawType) }
        buffer.moveReaderIndex(forwardBy: size)
        return YamuxHeader(type: type, flags: Flags(rawValue: rawFlags), streamID: streamID, length: length)
    }
}

/// Splits the bytes of a yamux connection into headers and payload pieces, however the bytes were cut
/// into reads. Data payloads are handed out as slices of the reads as they arrive (no copy, no waiting
/// for a whole frame); only the bytes of a header split across two reads are copied.
public struct YamuxFrameDecoder: Sendable {
    /// What the decoder found next.
    public enum Event: Hashable, Sendable {
        /// A frame header. After a data header, `.data` pieces totalling `length` bytes follow.
        case header(YamuxHeader)
        /// The next piece of the current data frame's payload.
        case data(ByteBuffer)
    }

    /// The largest data payload accepted in one frame; a bigger one is
    /// ``MultiplexerError/frameTooLarge(length:limit:)``.
    public let maxDataLength: Int
    private var buffer = ByteBuffer()
    private var carry = ByteBuffer()
    private var payloadRemaining = 0

    /// Creates a decoder that refuses data frames longer than `maxDataLength`.
    public init(maxDataLength: Int) {
        self.maxDataLength = maxDataLength
    }

    /// Bytes of the current data frame's payload still to come.
    public var pendingPayloadBytes: Int { payloadRemaining }

    /// Whether part of a frame (a header's first bytes, or payload still to come) has been fed.
    public var isMidFrame: Bool { payloadRemaining > 0 || carry.readableBytes > 0 || buffer.readableBytes > 0 }

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
        if payloadRemaining > 0 {
            let count = min(payloadRemaining, buffer.readableBytes)
            guard count > 0, let piece = buffer.readSlice(length: count) else { return nil }
            payloadRemaining -= count
            return .data(piece)
        }
        let header: YamuxHeader
        if carry.readableBytes == 0, let parsed = try YamuxHeader.read(from: &buffer) {
            header = parsed
        } else {
            // A header split across reads: gather exactly its 12 bytes.
            let take = min(YamuxHeader.size - carry.readableBytes, buffer.readableBytes)
            if take > 0, var piece = buffer.readSlice(length: take) { carry.writeBuffer(&piece) }
            guard let parsed = try YamuxHeader.read(from: &carry) else { return nil }
            carry.clear()
            header = parsed
        }
        if header.type == .data {
            guard header.length <= maxDataLength else {
                throw .frameTooLarge(length: UInt64(header.length), limit: maxDataLength)
            }
            payloadRemaining = Int(header.length)
        }
        return .header(header)
    }
}
