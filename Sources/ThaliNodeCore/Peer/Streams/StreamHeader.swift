import NIOCore

/// What a stream carries, named in its ``StreamHeader``: ``delivery``, ``relay``, or an app's own
/// protocol (``app(_:)``, `app/<name>`). The name is printable ASCII without spaces, 1 to
/// ``StreamHeader/maximumKindLength`` bytes (spec/node.md, "Stream marking").
public struct StreamKind: Hashable, Sendable, CustomStringConvertible {
    /// The kind as it goes on the wire (`delivery`, `relay`, `app/chat`).
    public let name: String

    /// The delivery protocol: the side that opens the stream receives, the other side sends.
    public static let delivery = StreamKind(checked: "delivery")
    /// A relayed TCP connection: the accepting node joins the stream to a connection to its app port.
    public static let relay = StreamKind(checked: "relay")
    /// The prefix of an app protocol's kind.
    public static let appPrefix = "app/"

    /// A kind named `name`; throws ``StreamHeaderError/emptyKind``, ``StreamHeaderError/kindTooLong(length:maximum:)``
    /// or ``StreamHeaderError/kindNotPrintableASCII(byte:)`` for a name the wire cannot carry.
    public init(_ name: String) throws(StreamHeaderError) {
        try Self.validate(Array(name.utf8))
        self.name = name
    }

    private init(checked name: String) { self.name = name }

    /// The kind of an app's protocol `protocolName` (`app/<protocolName>`).
    public static func app(_ protocolName: String) throws(StreamHeaderError) -> StreamKind {
        guard !protocolName.isEmpty else { throw .emptyKind }
        return try StreamKind(appPrefix + protocolName)
    }

    /// The app protocol's name when this is an app kind (`chat` for `app/chat`), else nil.
    public var appProtocol: String? {
        guard name.hasPrefix(Self.appPrefix), name.utf8.count > Self.appPrefix.utf8.count else { return nil }
        return String(name.dropFirst(Self.appPrefix.count))
    }

    public var description: String { name }

    static func validate(_ bytes: [UInt8]) throws(StreamHeaderError) {
        guard !bytes.isEmpty else { throw .emptyKind }
        guard bytes.count <= StreamHeader.maximumKindLength else {
            throw .kindTooLong(length: bytes.count, maximum: StreamHeader.maximumKindLength)
        }
        if let bad = bytes.first(where: { !(0x21...0x7E).contains($0) }) { throw .kindNotPrintableASCII(byte: bad) }
    }
}

/// The first bytes of every stream the opener sends on a marked session (one whose PSK-TLS handshake
/// agreed on ``alpnProtocol``): `length (1 byte) ‖ kind (length bytes)`. The accepting side reads it,
/// dispatches, and answers with a ``StreamStatus`` before any byte of the stream's own protocol.
public struct StreamHeader: Hashable, Sendable {
    /// The ALPN protocol id that marks a session's streams (TLS ALPN, spec/psk-tls.md): both sides of a
    /// session that agreed on it frame every stream with a header and a status; a session without it
    /// carries unmarked streams, as peers before marking did.
    public static let alpnProtocol = "thali-streams/1"
    /// The longest kind name, in bytes. A header announcing more is refused before its bytes arrive.
    public static let maximumKindLength = 64
    /// The longest header on the wire: the length byte and the longest kind.
    public static let maximumEncodedLength = 1 + maximumKindLength

    /// What the stream carries.
    public var kind: StreamKind

    /// A header naming `kind`.
    public init(kind: StreamKind) { self.kind = kind }

    /// Appends the header's bytes to `buffer`.
    package func encode(into buffer: inout ByteBuffer) {
        let bytes = Array(kind.name.utf8)
        buffer.writeInteger(UInt8(bytes.count))
        buffer.writeBytes(bytes)
    }

    /// Reads one header from the front of `buffer`: nil (and nothing consumed) while it is incomplete;
    /// a typed error as soon as the bytes present cannot start a valid header (a length of 0 or over
    /// ``maximumKindLength`` fails on its first byte, without waiting for the rest).
    package static func decode(from buffer: inout ByteBuffer) throws(StreamHeaderError) -> StreamHeader? {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self) else { return nil }
        guard length > 0 else { throw .emptyKind }
        guard Int(length) <= maximumKindLength else { throw .kindTooLong(length: Int(length), maximum: maximumKindLength) }
        let present = min(Int(length), buffer.readableBytes - 1)
        let bytes = buffer.getBytes(at: buffer.readerIndex + 1, length: present) ?? []
        if let bad = bytes.first(where: { !(0x21...0x7E).contains($0) }) { throw .kindNotPrintableASCII(byte: bad) }
        guard present == Int(length) else { return nil }
        buffer.moveReaderIndex(forwardBy: 1 + Int(length))
        return StreamHeader(kind: StreamKind(uncheckedBytes: bytes))
    }
}

extension StreamKind {
    /// A kind from bytes ``StreamHeader/decode(from:)`` checked already.
    fileprivate init(uncheckedBytes bytes: [UInt8]) { self.init(checked: String(decoding: bytes, as: UTF8.self)) }
}

/// Why the accepting side did not serve a stream: a ``Code`` and a reason in words, sent in the
/// ``StreamStatus`` and thrown on the opener's side (the stream's reads fail with it).
public struct StreamRefusal: Error, Hashable, Sendable, CustomStringConvertible {
    /// The refusal's code on the wire (1...255; 0 is acceptance).
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }

        /// The kind is well formed but this implementation knows no such kind.
        public static let unknownKind = Code(rawValue: 1)
        /// The kind is known but this node does not serve it now (relay without an app port, an app
        /// protocol with no handler, delivery switched off).
        public static let notServed = Code(rawValue: 2)
        /// Relay: the node's app port did not take the connection.
        public static let appUnreachable = Code(rawValue: 3)
        /// The header was malformed, incomplete at the end of the stream, or late.
        public static let badHeader = Code(rawValue: 4)

        /// `unknown-kind`, `not-served`, `app-unreachable`, `bad-header`, or `code N`.
        public var description: String {
            switch self {
            case .unknownKind: "unknown-kind"
            case .notServed: "not-served"
            case .appUnreachable: "app-unreachable"
            case .badHeader: "bad-header"
            default: "code \(rawValue)"
            }
        }
    }

    /// What kind of refusal.
    public var code: Code
    /// Why, in words, from the refusing node (printable ASCII, at most ``StreamStatus/maximumReasonLength`` bytes).
    public var reason: String

    /// A refusal with `code` and `reason` (cut to the limit and to printable ASCII when encoded).
    public init(_ code: Code, reason: String) {
        self.code = code
        self.reason = reason
    }

    /// "refused (not-served): relay is not served: this node has no app port".
    public var description: String { "refused (\(code)): \(reason)" }
}

/// The accepting side's answer, the first bytes it sends on a marked stream:
/// `code (1 byte) ‖ reason length (1 byte) ‖ reason`. Code 0 accepts (with no reason); any other
/// code refuses, and the accepting side closes the stream after it.
public enum StreamStatus: Hashable, Sendable {
    /// The stream's protocol follows.
    case accepted
    /// Not served; the stream ends.
    case refused(StreamRefusal)

    /// The longest reason, in bytes.
    public static let maximumReasonLength = 200
    /// The longest status on the wire.
    public static let maximumEncodedLength = 2 + maximumReasonLength

    /// Appends the status's bytes; a refusal's reason is cut to ``maximumReasonLength`` bytes and its
    /// characters outside printable ASCII become `?`.
    package func encode(into buffer: inout ByteBuffer) {
        switch self {
        case .accepted:
            buffer.writeInteger(UInt8(0))
            buffer.writeInteger(UInt8(0))
        case .refused(let refusal):
            let reason = refusal.reason.utf8.prefix(Self.maximumReasonLength).map { (0x20...0x7E).contains($0) ? $0 : UInt8(ascii: "?") }
            buffer.writeInteger(refusal.code.rawValue == 0 ? StreamRefusal.Code.notServed.rawValue : refusal.code.rawValue)
            buffer.writeInteger(UInt8(reason.count))
            buffer.writeBytes(reason)
        }
    }

    /// Reads one status from the front of `buffer`: nil (nothing consumed) while incomplete; a typed
    /// error as soon as the bytes present cannot start a valid status.
    package static func decode(from buffer: inout ByteBuffer) throws(StreamHeaderError) -> StreamStatus? {
        guard let code = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self),
              let length = buffer.getInteger(at: buffer.readerIndex + 1, as: UInt8.self) else { return nil }
        guard Int(length) <= maximumReasonLength else { throw .reasonTooLong(length: Int(length), maximum: maximumReasonLength) }
        guard code != 0 || length == 0 else { throw .reasonOnAcceptance }
        let present = min(Int(length), buffer.readableBytes - 2)
        let bytes = buffer.getBytes(at: buffer.readerIndex + 2, length: present) ?? []
        if let bad = bytes.first(where: { !(0x20...0x7E).contains($0) }) { throw .reasonNotPrintableASCII(byte: bad) }
        guard present == Int(length) else { return nil }
        buffer.moveReaderIndex(forwardBy: 2 + Int(length))
        if code == 0 { return .accepted }
        return .refused(StreamRefusal(StreamRefusal.Code(rawValue: code), reason: String(decoding: bytes, as: UTF8.self)))
    }
}

/// A stream header or status that cannot be read, or did not come: each names what was wrong.
public enum StreamHeaderError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A kind of length 0.
    case emptyKind
    /// A kind longer than the limit.
    case kindTooLong(length: Int, maximum: Int)
    /// A kind byte outside printable ASCII (0x21...0x7E).
    case kindNotPrintableASCII(byte: UInt8)
    /// A refusal reason longer than the limit.
    case reasonTooLong(length: Int, maximum: Int)
    /// A reason byte outside printable ASCII (0x20...0x7E).
    case reasonNotPrintableASCII(byte: UInt8)
    /// An acceptance (code 0) that carries a reason.
    case reasonOnAcceptance
    /// The stream's input ended after `received` bytes, before a whole header.
    case endedBeforeHeader(received: Int)
    /// The stream's input ended after `received` bytes, before a whole status.
    case endedBeforeStatus(received: Int)
    /// No whole header within the timeout (milliseconds).
    case headerTimedOut(milliseconds: Int64)
    /// No whole status within the timeout (milliseconds).
    case statusTimedOut(milliseconds: Int64)

    public var description: String {
        switch self {
        case .emptyKind: "stream header names an empty kind"
        case .kindTooLong(let length, let maximum): "stream kind of \(length) bytes exceeds the limit of \(maximum)"
        case .kindNotPrintableASCII(let byte): "stream kind holds byte 0x\(String(byte, radix: 16)), not printable ASCII"
        case .reasonTooLong(let length, let maximum): "stream refusal reason of \(length) bytes exceeds the limit of \(maximum)"
        case .reasonNotPrintableASCII(let byte): "stream refusal reason holds byte 0x\(String(byte, radix: 16)), not printable ASCII"
        case .reasonOnAcceptance: "stream status accepts but carries a reason"
        case .endedBeforeHeader(let received): "stream ended after \(received) bytes, before its header"
        case .endedBeforeStatus(let received): "stream ended after \(received) bytes, before the other node's answer to its header"
        case .headerTimedOut(let ms): "no stream header within \(ms) ms"
        case .statusTimedOut(let ms): "no answer to the stream header within \(ms) ms"
        }
    }
}
