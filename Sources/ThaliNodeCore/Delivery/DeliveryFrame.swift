import Foundation
import NIOCore

/// The kind of a delivered item: a short UTF-8 text or a file with a name. The raw value is the name
/// used in the store and in JSON output; ``wireCode`` is its byte on the wire.
public enum ItemKind: String, Sendable, Hashable, Codable, CaseIterable {
    /// A UTF-8 text, at most ``DeliveryLimits/maxTextBytes``.
    case text
    /// A file, at most ``DeliveryLimits/maxItemBytes``, with a file name.
    case file

    /// The kind's byte in an offer frame.
    public var wireCode: UInt8 { self == .text ? 0 : 1 }

    /// The kind with wire byte `code`, if any.
    public init?(wireCode code: UInt8) {
        switch code {
        case 0: self = .text
        case 1: self = .file
        default: return nil
        }
    }
}

/// What a sender announces about one item before any content moves.
public struct ItemOffer: Sendable, Hashable {
    /// The item's idempotent id, chosen when it was queued; the receiver stores each id once per sender.
    public var id: UUID
    /// Text or file.
    public var kind: ItemKind
    /// The content length in bytes.
    public var size: UInt64
    /// SHA-256 of the whole content (32 bytes); the receiver verifies it before committing.
    public var sha256: [UInt8]
    /// When the item was queued, in milliseconds since the epoch.
    public var createdMilliseconds: UInt64
    /// When the item expires, in milliseconds since the epoch.
    public var expiresMilliseconds: UInt64
    /// The file name (empty for text).
    public var name: String

    /// Creates an offer.
    public init(id: UUID, kind: ItemKind, size: UInt64, sha256: [UInt8], createdMilliseconds: UInt64,
                expiresMilliseconds: UInt64, name: String) {
        self.id = id
        self.kind = kind
        self.size = size
        self.sha256 = sha256
        self.createdMilliseconds = createdMilliseconds
        self.expiresMilliseconds = expiresMilliseconds
        self.name = name
    }

    /// The encoded size of an offer without its name: id 16, kind 1, size 8, sha256 32, created 8,
    /// expires 8, name length 2.
    public static let fixedBytes = 16 + 1 + 8 + 32 + 8 + 8 + 2
}

/// Why a receiver declines an item without transferring it. Reasons 1-3 are permanent: the sender marks
/// the item refused and does not offer it again. ``noSpace`` (version 4) is temporary: the sender keeps
/// the item pending and offers it again later.
public enum ItemRefusal: UInt8, Sendable, Hashable, CaseIterable {
    /// Larger than the receiver's ``DeliveryLimits/maxItemBytes`` (or `maxTextBytes` for text).
    case tooLarge = 1
    /// The file name is not a safe single path component (empty, `.`, `..`, contains `/` or NUL), or a
    /// text item carries a name.
    case invalidName = 2
    /// Already expired by the receiver's clock.
    case expired = 3
    /// Version 4: the receiver cannot hold the item now (its disk lacks the space); offer it again later.
    /// A temporary refusal: the item stays pending. Sent only to a sender that said `hello(4)` or later.
    case noSpace = 4

    /// Whether the refusal is temporary (the item stays pending and is offered again later).
    public var isTemporary: Bool { self == .noSpace }

    /// The first protocol version that has this refusal (a receiver never sends it to an older sender).
    public var sinceVersion: UInt8 { self == .noSpace ? DeliveryFrame.temporaryRefusalVersion : 1 }

    /// The refusal as `run --json` names it: `too_large`, `invalid_name`, `expired`, `no_space`.
    public var code: String {
        switch self {
        case .tooLarge: "too_large"
        case .invalidName: "invalid_name"
        case .expired: "expired"
        case .noSpace: "no_space"
        }
    }

    /// Why `receiver` declined the item, in words for the sender's user ("larger than what carol
    /// accepts"); never a case name.
    public func explanation(receiver: String) -> String {
        switch self {
        case .tooLarge: "larger than what \(receiver) accepts"
        case .invalidName: "its name is not one \(receiver) accepts as a file name"
        case .expired: "it had expired by \(receiver)'s clock"
        case .noSpace: "not enough space"
        }
    }
}

/// Why a receiver discarded a completely transferred item. The sender keeps the item and tries again in a
/// later session, from the start.
public enum TransferFailure: UInt8, Sendable, Hashable, CaseIterable {
    /// The content's SHA-256 differs from the offer's.
    case digestMismatch = 1
    /// A text item is not valid UTF-8.
    case invalidText = 2

    /// What was wrong, in words for people ("its SHA-256 did not match the offer's"); never a case name.
    public var explanation: String {
        switch self {
        case .digestMismatch: "its SHA-256 did not match the offer's"
        case .invalidText: "the text was not valid UTF-8"
        }
    }
}

/// The receiver's answer to an offer.
public enum ItemAnswer: Sendable, Hashable {
    /// The receiver has nothing of this item: send it all.
    case nothing
    /// The receiver holds the first `offset` bytes, whose SHA-256 is `prefixSHA256`. The sender resumes at
    /// `offset` if its own prefix has that digest, else restarts at 0.
    case partial(offset: UInt64, prefixSHA256: [UInt8])
    /// The item is already in the receiver's inbox: the sender may forget it.
    case complete
    /// The receiver will not take the item.
    case refused(ItemRefusal)
}

/// Why a side ended a delivery session, as an `error` frame carries it (protocol version 2). Any byte
/// is kept as it came: a code this version does not name is still reported, by number.
public struct DeliveryErrorCode: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
    /// The code's byte on the wire.
    public var rawValue: UInt8
    /// Creates the code with byte `rawValue`.
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// A frame that the protocol does not allow, or that is malformed.
    public static let protocolViolation = DeliveryErrorCode(rawValue: 1)
    /// A frame payload above the receiver's maximum.
    public static let frameTooLarge = DeliveryErrorCode(rawValue: 2)
    /// A protocol version the side does not speak.
    public static let unsupportedVersion = DeliveryErrorCode(rawValue: 3)
    /// Another limit of the side exceeded (a file name too long, say).
    public static let limitExceeded = DeliveryErrorCode(rawValue: 4)
    /// The side failed on its own (a full disk, say); the other side did nothing wrong.
    public static let internalError = DeliveryErrorCode(rawValue: 5)

    public var description: String {
        switch self {
        case .protocolViolation: "protocol violation"
        case .frameTooLarge: "frame too large"
        case .unsupportedVersion: "unsupported version"
        case .limitExceeded: "limit exceeded"
        case .internalError: "internal error"
        default: "error \(rawValue)"
        }
    }
}

/// One frame of the delivery protocol (version 5; a receiver also accepts version 1 to 4 senders, and
/// a sender speaks version 2, 3 or 4 with a receiver that welcomes it so).
///
/// Every frame is `type (1 byte) ‖ payload length (4 bytes, big endian) ‖ payload`. The payload length
/// is bounded by ``DeliveryLimits/maxFramePayloadBytes``. Ids are the 16 raw bytes of a UUID, integers
/// are unsigned big endian. See `spec/node.md`, "Delivery protocol".
public enum DeliveryFrame: Sendable, Hashable {
    /// Sender → receiver, first frame: the protocol version (``DeliveryFrame/protocolVersion``).
    case hello(version: UInt8)
    /// Receiver → sender, the answer to `hello` from a version 2 or later sender: the version both speak
    /// and the largest frame payload the receiver accepts. The sender's frames stay within it. From
    /// version 3 it also carries `progressWindowBytes`: the sender never has more content bytes sent
    /// beyond the receiver's last `progress` (nil: version 2, no window and no `progress` frames). From
    /// version 5 it also carries `lingerMilliseconds`: how long the receiver keeps the stream open,
    /// waiting, once every item offered so far is answered, so that the sender can offer an item queued
    /// meanwhile on it (0: it does not wait; nil: before version 5).
    case welcome(version: UInt8, maxFramePayloadBytes: UInt32, progressWindowBytes: UInt32? = nil, lingerMilliseconds: UInt32? = nil)
    /// Either side, version 2, just before it ends the session on an error: why, as a code and in words
    /// (UTF-8, at most ``DeliveryFrame/maximumErrorReasonBytes``).
    case error(code: DeliveryErrorCode, reason: String)
    /// Sender → receiver: an item's metadata.
    case offer(ItemOffer)
    /// Receiver → sender: what the receiver already has of item `id`.
    case answer(id: UUID, ItemAnswer)
    /// Sender → receiver: content of item `id` follows, starting at byte `offset`.
    case start(id: UUID, offset: UInt64)
    /// Sender → receiver: the next content bytes of the item being streamed (at least 1 byte).
    case data(ByteBuffer)
    /// Sender → receiver: all content of item `id` has been sent.
    case end(id: UUID)
    /// Receiver → sender: item `id` is committed to the inbox; the sender removes it.
    case ack(id: UUID)
    /// Receiver → sender: item `id` arrived damaged and was discarded.
    case reject(id: UUID, TransferFailure)
    /// Sender → receiver: no more items in this session.
    case done
    /// Receiver → sender, version 3: `bytes` of item `id` (counted from its start, a resumed prefix
    /// included) are written to the receiver's partial file. What a sender reports as progress.
    case progress(id: UUID, bytes: UInt64)
    /// Sender → receiver, version 3: a whole text item in one frame, its offer and content together.
    /// Items follow one another without waiting; `endsBatch` marks the last of a batch, which the
    /// receiver commits in one transaction before it answers each item in order (`ack`, or `answer`
    /// complete / refused, or `reject`).
    case item(ItemOffer, content: ByteBuffer, endsBatch: Bool)

    /// The protocol version this implementation speaks (and sends in `hello`).
    public static let protocolVersion: UInt8 = 5
    /// The first version with `progress` frames, the progress window and `item` batches.
    public static let progressVersion: UInt8 = 3
    /// The first version with a temporary refusal (``ItemRefusal/noSpace``). Its `welcome` has version
    /// 3's layout; a version 3 reader treats an unknown refusal code as an error, hence a new version.
    public static let temporaryRefusalVersion: UInt8 = 4
    /// The first version in which a sender may keep the stream open once everything is answered, and
    /// offer items queued meanwhile on it (its `welcome` adds the receiver's `lingerMilliseconds`).
    public static let lingerVersion: UInt8 = 5
    /// The oldest sender version a receiver still accepts: version 1 has no `welcome` and no `error`,
    /// which is safe for the receiver (it sends neither to a version 1 sender).
    public static let oldestAcceptedVersion: UInt8 = 1
    /// The longest reason an `error` frame carries, in UTF-8 bytes: with its code byte the frame fits in
    /// the smallest frame maximum a side may have (``DeliveryLimits/minimumFramePayloadBytes``).
    public static let maximumErrorReasonBytes = 1000

    /// The `error` frame that reports `failure` to the other side, its reason cut to
    /// ``maximumErrorReasonBytes`` on a character boundary; nil for failures that are not the other
    /// side's to hear about (the stream already ended, or the other side reported the error itself).
    public static func error(reporting failure: DeliveryProtocolError) -> DeliveryFrame? {
        let code: DeliveryErrorCode
        switch failure {
        case .connectionClosed, .peerReported: return nil
        case .frameTooLarge: code = .frameTooLarge
        case .unsupportedVersion: code = .unsupportedVersion
        case .nameTooLong, .noSpace: code = .limitExceeded
        case .unknownFrameType, .malformedFrame, .unexpectedFrame, .itemMismatch, .sizeMismatch, .invalidOffset: code = .protocolViolation
        }
        return .error(code: code, reason: errorReason(failure.description))
    }

    /// The `error` frame (`internalError`) that tells the other side this side failed on its own, such
    /// as a write to a full disk: the reason in words, without this side's paths.
    public static func error(reporting failure: NodeError) -> DeliveryFrame? {
        let reason: String = switch failure {
        case .dataDirectoryUnusable(_, let reason): "the receiver could not store it: \(reason); it is kept for a resume"
        default: failure.description
        }
        return .error(code: .internalError, reason: errorReason(reason))
    }

    /// `text` cut to ``maximumErrorReasonBytes`` on a character boundary.
    private static func errorReason(_ text: String) -> String {
        var reason = ""
        var bytes = 0
        for character in text {
            bytes += character.utf8.count
            guard bytes <= maximumErrorReasonBytes else { break }
            reason.append(character)
        }
        return reason
    }

    /// The size of a frame header: type and payload length.
    public static let headerBytes = 5

    /// The frame type codes on the wire.
    enum FrameType: UInt8 {
        case hello = 1, offer, answer, start, data, end, ack, reject, done, welcome, error, progress, item
    }

    /// The encoded size of an `item` frame's payload before the content: flags, then the offer.
    public static func itemHeaderBytes(_ offer: ItemOffer) -> Int { 1 + ItemOffer.fixedBytes + offer.name.utf8.count }

    /// A short name for errors and logs (no payload).
    public var name: String {
        switch self {
        case .hello: "hello"
        case .offer: "offer"
        case .answer: "answer"
        case .start: "start"
        case .data: "data"
        case .end: "end"
        case .ack: "ack"
        case .reject: "reject"
        case .done: "done"
        case .welcome: "welcome"
        case .error: "error"
        case .progress: "progress"
        case .item: "item"
        }
    }
}

/// A violation of the delivery protocol by the peer (or a limit it exceeded). The session ends; nothing
/// already committed is affected and a partial file stays for a later resume.
public enum DeliveryProtocolError: Error, Hashable, CustomStringConvertible {
    /// A frame header announced a payload larger than ``DeliveryLimits/maxFramePayloadBytes``.
    case frameTooLarge(length: Int, limit: Int)
    /// A frame type this version does not know.
    case unknownFrameType(UInt8)
    /// A frame's payload does not have the layout its type requires.
    case malformedFrame(type: String, reason: String)
    /// An offer's name is longer than ``DeliveryLimits/maxNameBytes``.
    case nameTooLong(length: Int, limit: Int)
    /// The peer speaks another protocol version.
    case unsupportedVersion(UInt8)
    /// A frame that the protocol does not allow in the current state.
    case unexpectedFrame(frame: String, state: String)
    /// A frame about another item than the one in progress.
    case itemMismatch(expected: UUID, received: UUID)
    /// The sender sent more (or, at its end, fewer) bytes than the offer's size.
    case sizeMismatch(expected: UInt64, received: UInt64)
    /// A resume offset that the receiver did not propose.
    case invalidOffset(UInt64)
    /// The receiver cannot hold an offered file now and the sender is older than version 4, which has
    /// no temporary refusal: the session ends with this reason (`error(limitExceeded)` to a version 2
    /// or 3 sender). `needed` is what the file still needs plus the reserve the receiver keeps free.
    case noSpace(name: String, size: UInt64, needed: UInt64, free: UInt64)
    /// The byte stream ended before the session was finished.
    case connectionClosed(state: String)
    /// The other side ended the session with an `error` frame. `peer` names it (the session's contact;
    /// nil: "the peer"), `subject` is what it refused (the item in progress, or nil for the session).
    case peerReported(code: DeliveryErrorCode, reason: String, peer: String?, subject: String?)

    /// This error with the other side named `peer` (only a ``peerReported(code:reason:peer:subject:)``
    /// names the other side).
    public func naming(peer name: String) -> DeliveryProtocolError {
        guard case .peerReported(let code, let reason, _, let subject) = self else { return self }
        return .peerReported(code: code, reason: reason, peer: name, subject: subject)
    }

    public var description: String {
        switch self {
        case .frameTooLarge(let length, let limit): "frame payload of \(length) bytes exceeds the limit of \(limit)"
        case .unknownFrameType(let type): "unknown frame type \(type)"
        case .malformedFrame(let type, let reason): "malformed \(type) frame: \(reason)"
        case .nameTooLong(let length, let limit): "file name of \(length) bytes exceeds the limit of \(limit)"
        case .unsupportedVersion(let version): "unsupported delivery protocol version \(version)"
        case .unexpectedFrame(let frame, let state): "unexpected \(frame) frame while \(state)"
        case .itemMismatch(let expected, let received): "frame for item \(received) while transferring \(expected)"
        case .sizeMismatch(let expected, let received): "item of \(expected) bytes but \(received) bytes sent"
        case .invalidOffset(let offset): "resume offset \(offset) was not proposed"
        case .noSpace(let name, let size, let needed, let free):
            "not enough space for \"\(name)\" (\(ByteCount.format(size))): \(ByteCount.format(free)) free, \(ByteCount.format(needed)) needed; offer it again later"
        case .connectionClosed(let state): "connection closed while \(state)"
        case .peerReported(_, let reason, let peer, let subject):
            subject.map { "\(peer ?? "the peer") refused \($0): \(reason)" } ?? "\(peer ?? "the peer") ended the delivery session: \(reason)"
        }
    }
}
