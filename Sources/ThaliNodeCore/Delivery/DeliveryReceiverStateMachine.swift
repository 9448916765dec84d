import Foundation
import NIOCore
import ThaliMutants

/// The receiving side of a delivery session as a pure state machine: it consumes frames and the results
/// of the I/O it asked for, and returns the next action. It performs no I/O itself.
///
/// hello → welcome (version 2 and later senders), then per item: offer → (look up inbox, partial file and,
/// for a file, the free space) → answer → start → data… → end → (verify digest) → (commit to the inbox) → ack. From version 3 a text
/// may instead come whole in an `item` frame; the items of a batch are committed together, then answered
/// in order. Each step is only accepted in the state that expects it; an `error` frame from the sender
/// ends the session.
public struct DeliveryReceiverStateMachine: Sendable {
    /// The states of the receiving side.
    public enum State: Sendable, Hashable {
        /// Waiting for the sender's `hello`.
        case awaitingHello
        /// Waiting for an offer or `done`.
        case idle
        /// Looking up what is already stored of an offered item.
        case lookingUp(ItemOffer)
        /// Answered; waiting for `start`. `available` is the partial length that was proposed (0 if none).
        case awaitingStart(ItemOffer, available: UInt64)
        /// Receiving content; `received` counts bytes from the start of the item (resumed prefix included).
        case receiving(ItemOffer, received: UInt64)
        /// All bytes arrived; waiting for the content's digest.
        case verifying(ItemOffer)
        /// Digest matched; committing to the inbox.
        case committing(ItemOffer)
        /// The sender said `done`.
        case finished
        /// A protocol error ended the session.
        case failed
    }

    /// What the driver must do next.
    public enum Action: Sendable, Hashable {
        /// Nothing; read the next frame.
        case none
        /// Send this frame, then read the next.
        case send(DeliveryFrame)
        /// Find what is stored of this item (inbox entry, partial file) and call ``lookUpCompleted(_:)``.
        case lookUp(ItemOffer)
        /// Open the partial file of this item keeping exactly its first `offset` bytes (0: start afresh).
        case preparePartial(ItemOffer, offset: UInt64)
        /// Append these bytes to the partial file.
        case append(ByteBuffer)
        /// Make the partial file durable, compute its SHA-256 and call ``contentVerified(digest:)``.
        case verify(ItemOffer)
        /// Commit the partial file to the inbox in one transaction, then call ``committed()``.
        case commit(ItemOffer)
        /// Delete the partial file and send this frame.
        case discardPartial(ItemOffer, then: DeliveryFrame)
        /// The session is over; close the stream.
        case finish
        /// Version 3: keep this entry of the current batch, in order; when `commit`, verify and commit the
        /// batch's texts in one transaction, then send each entry's answer in order (see ``BatchEntry``).
        case batch(BatchEntry, commit: Bool)
    }

    /// One item of a batch of `item` frames, answered after the batch's commit in the order it came.
    public enum BatchEntry: Sendable, Hashable {
        /// A text to verify (SHA-256, UTF-8) and commit: answered `ack` once committed, `answer(complete)`
        /// if the inbox already held it, `reject` if damaged.
        case text(ItemOffer, content: ByteBuffer)
        /// Refused without a commit: answered `answer(refused)`.
        case refused(ItemOffer, ItemRefusal)
    }

    /// The result of looking up an offered item.
    public enum LookUpResult: Sendable, Hashable {
        /// Nothing stored.
        case nothing
        /// A partial file of `length` bytes whose SHA-256 is `prefixSHA256`.
        case partial(length: UInt64, prefixSHA256: [UInt8])
        /// Already in the inbox.
        case complete
        /// A file whose remaining bytes plus the reserve (``DeliveryLimits/minimumFreeBytes``), `needed`
        /// in all, exceed the `free` bytes of the partial files' file system now. A version 4 sender is
        /// refused with ``ItemRefusal/noSpace`` (temporary); an older one has no temporary refusal, so the
        /// session ends with ``DeliveryProtocolError/noSpace(name:size:needed:free:)`` (an `error` frame
        /// to a version 2 or 3 sender).
        case noSpace(needed: UInt64, free: UInt64)
    }

    /// The current state.
    public private(set) var state: State = .awaitingHello
    /// The protocol version of the session, once the sender's `hello` came: 1 (no `welcome`, no `error`
    /// frames) or ``DeliveryFrame/protocolVersion``.
    public private(set) var version: UInt8?

    /// Whether the sender understands `error` frames (it speaks version 2).
    public var senderHearsErrors: Bool { (version ?? 0) >= 2 }
    /// Whether the sender reads `progress` frames (it speaks version 3).
    public var senderHearsProgress: Bool { (version ?? 0) >= DeliveryFrame.progressVersion }
    /// Whether the sender understands a temporary refusal (``ItemRefusal/noSpace``: it speaks version 4).
    public var senderHearsTemporaryRefusals: Bool { (version ?? 0) >= DeliveryFrame.temporaryRefusalVersion }
    /// Items of the current batch received but not yet committed.
    public private(set) var itemsInBatch = 0
    /// The limits offers are checked against.
    public let limits: DeliveryLimits
    /// The receiver's clock (milliseconds since the epoch), to refuse expired offers.
    private let now: @Sendable () -> UInt64

    /// Creates a receiver in the `awaitingHello` state.
    public init(limits: DeliveryLimits, now: @escaping @Sendable () -> UInt64 = { DeliveryClock.nowMilliseconds }) {
        self.limits = limits
        self.now = now
    }

    /// Feeds one frame from the sender.
    public mutating func receive(_ frame: DeliveryFrame) throws -> Action {
        switch (state, frame) {
        case (.awaitingHello, .hello(let offered)):
            guard offered >= DeliveryFrame.oldestAcceptedVersion, !(Mutant.deliveryReceiverRefusesNewerHello.isActive && offered > 1) else {
                return try fail(.unsupportedVersion(offered))
            }
            state = .idle
            // A later sender gets the highest version we speak; it speaks that one too.
            let version = min(offered, DeliveryFrame.protocolVersion)
            self.version = version
            guard version >= 2 else { return .none }
            let window = version >= DeliveryFrame.progressVersion ? UInt32(clamping: limits.progressWindowBytes) : nil
            // Version 5: how long we wait for the next offer once everything is answered (the sender
            // may keep the stream open that long); within half our idle timeout, so that it never fires.
            let linger = version >= DeliveryFrame.lingerVersion ? UInt32(clamping: limits.effectiveLinger.wholeMilliseconds) : nil
            return .send(.welcome(version: version, maxFramePayloadBytes: UInt32(clamping: limits.maxFramePayloadBytes),
                                  progressWindowBytes: window, lingerMilliseconds: linger))
        case (.finished, _), (.failed, _):
            return try fail(.unexpectedFrame(frame: frame.name, state: stateName))
        case (_, .error(let code, let reason)):
            return try fail(.peerReported(code: code, reason: reason, peer: nil, subject: nil))
        case (.idle, .item(let offer, let content, let endsBatch)) where senderHearsProgress:
            itemsInBatch += 1
            let commit = endsBatch || itemsInBatch >= limits.maxBatchItems
            if commit { itemsInBatch = 0 }
            let entry: BatchEntry = refusal(of: offer).map { .refused(offer, $0) } ?? .text(offer, content: content)
            return .batch(entry, commit: commit)
        case (.idle, .offer) where itemsInBatch > 0, (.idle, .done) where itemsInBatch > 0:
            // A batch ends with its marked item; nothing else comes in between.
            return try fail(.unexpectedFrame(frame: frame.name, state: "in a batch of items"))
        case (.idle, .offer(let offer)):
            if let refusal = refusal(of: offer) { return .send(.answer(id: offer.id, .refused(refusal))) }
            state = .lookingUp(offer)
            return .lookUp(offer)
        case (.idle, .done):
            state = .finished
            return .finish
        case (.awaitingStart(let offer, let available), .start(let id, let offset)):
            guard id == offer.id else { return try fail(.itemMismatch(expected: offer.id, received: id)) }
            guard offset == 0 || offset == available else { return try fail(.invalidOffset(offset)) }
            state = .receiving(offer, received: offset)
            return .preparePartial(offer, offset: offset)
        case (.receiving(let offer, let received), .data(let bytes)):
            let total = received + UInt64(bytes.readableBytes)
            guard total <= offer.size else { return try fail(.sizeMismatch(expected: offer.size, received: total)) }
            state = .receiving(offer, received: total)
            return .append(bytes)
        case (.receiving(let offer, let received), .end(let id)):
            guard id == offer.id else { return try fail(.itemMismatch(expected: offer.id, received: id)) }
            guard received == offer.size else { return try fail(.sizeMismatch(expected: offer.size, received: received)) }
            state = .verifying(offer)
            return .verify(offer)
        default:
            return try fail(.unexpectedFrame(frame: frame.name, state: stateName))
        }
    }

    /// Reports what ``Action/lookUp(_:)`` found.
    public mutating func lookUpCompleted(_ result: LookUpResult) throws -> Action {
        guard case .lookingUp(let offer) = state else { return try fail(.unexpectedFrame(frame: "look-up result", state: stateName)) }
        switch result {
        case .complete:
            state = .idle
            return .send(.answer(id: offer.id, .complete))
        case .partial(let length, let digest) where length > 0 && length <= offer.size:
            state = .awaitingStart(offer, available: length)
            return .send(.answer(id: offer.id, .partial(offset: length, prefixSHA256: digest)))
        case .nothing, .partial:
            state = .awaitingStart(offer, available: 0)
            return .send(.answer(id: offer.id, .nothing))
        case .noSpace(let needed, let free):
            guard senderHearsTemporaryRefusals else {
                return try fail(.noSpace(name: offer.name, size: offer.size, needed: needed, free: free))
            }
            state = .idle
            return .send(.answer(id: offer.id, .refused(.noSpace)))
        }
    }

    /// Reports the digest computed by ``Action/verify(_:)``.
    public mutating func contentVerified(digest: [UInt8]) throws -> Action {
        guard case .verifying(let offer) = state else { return try fail(.unexpectedFrame(frame: "digest", state: stateName)) }
        guard digest == offer.sha256 || Mutant.deliveryAcceptsDamaged.isActive else {
            state = .idle
            return .discardPartial(offer, then: .reject(id: offer.id, .digestMismatch))
        }
        state = .committing(offer)
        return .commit(offer)
    }

    /// Reports that a text item's content was not UTF-8 (found while committing).
    public mutating func commitRefusedInvalidText() throws -> Action {
        guard case .committing(let offer) = state else { return try fail(.unexpectedFrame(frame: "commit", state: stateName)) }
        state = .idle
        return .discardPartial(offer, then: .reject(id: offer.id, .invalidText))
    }

    /// Reports that ``Action/commit(_:)`` stored the item.
    public mutating func committed() throws -> Action {
        guard case .committing(let offer) = state else { return try fail(.unexpectedFrame(frame: "commit", state: stateName)) }
        state = .idle
        return .send(.ack(id: offer.id))
    }

    /// The item whose content is arriving or being verified, if any.
    public var transferring: ItemOffer? {
        switch state {
        case .receiving(let offer, _), .verifying(let offer): offer
        default: nil
        }
    }

    /// The `progress` frame that reports `written` bytes of the item being received, for a version 3
    /// sender; nil for an older one or outside a transfer.
    public func progress(written: UInt64) -> DeliveryFrame? {
        guard senderHearsProgress, !Mutant.deliverySendsNoProgress.isActive else { return nil }
        switch state {
        case .receiving(let offer, _), .verifying(let offer): return .progress(id: offer.id, bytes: written)
        default: return nil
        }
    }

    /// Reports the end of the byte stream; an error unless the session had finished.
    public mutating func streamEnded() throws {
        if state != .finished { _ = try fail(.connectionClosed(state: stateName)) }
    }

    private func refusal(of offer: ItemOffer) -> ItemRefusal? {
        switch offer.kind {
        case .text:
            if !offer.name.isEmpty { return .invalidName }
            if offer.size > limits.maxTextBytes { return .tooLarge }
        case .file:
            if !FileNames.isSafe(offer.name) { return .invalidName }
            if offer.size > limits.maxItemBytes { return .tooLarge }
        }
        if offer.expiresMilliseconds <= now() && !Mutant.deliveryAcceptsExpired.isActive { return .expired }
        return nil
    }

    private mutating func fail(_ error: DeliveryProtocolError) throws -> Action {
        state = .failed
        throw error
    }

    /// The state's name, for errors.
    package var stateName: String {
        switch state {
        case .awaitingHello: "awaiting hello"
        case .idle: "awaiting an offer"
        case .lookingUp: "looking up an item"
        case .awaitingStart: "awaiting start"
        case .receiving: "receiving"
        case .verifying: "verifying"
        case .committing: "committing"
        case .finished: "finished"
        case .failed: "failed"
        }
    }
}

/// The wall clock in the units the protocol uses.
public enum DeliveryClock {
    /// Milliseconds since the epoch, now.
    public static var nowMilliseconds: UInt64 { UInt64(max(0, Date().timeIntervalSince1970 * 1000)) }
}

/// Rules for file names that arrive from the network.
public enum FileNames {
    /// Whether `name` is a single, harmless path component: not empty, not `.` or `..`, no `/` or NUL,
    /// no control characters.
    public static func isSafe(_ name: String) -> Bool {
        guard !name.isEmpty, name != ".", name != ".." else { return false }
        return !name.unicodeScalars.contains { $0 == "/" || $0 == "\\" || $0.value < 0x20 || $0.value == 0x7F }
    }

    /// Whether `text` holds a character that reorders how text is shown: the bidirectional embeddings,
    /// overrides and isolates (U+202A-202E, U+2066-2069) and marks (U+200E, U+200F, U+061C). With U+202E,
    /// `photo\u{202E}gpj.exe` shows as `photoexe.jpg`.
    public static func hasBidirectionalControl(_ text: String) -> Bool {
        text.unicodeScalars.contains { isBidirectionalControl($0) }
    }

    /// The name a received file is stored under: `name` (already ``isSafe(_:)``) with every character that
    /// could mislead or drive whoever looks at it (bidirectional controls, other invisible format
    /// characters, C1 controls) replaced by `_`. The sender's name is kept as data in the inbox, shown
    /// escaped; the path on disk is one a person can read and paste.
    public static func storedName(for name: String) -> String {
        var result = String.UnicodeScalarView()
        for scalar in name.unicodeScalars {
            let misleading = isBidirectionalControl(scalar) || scalar.properties.generalCategory == .format
                || scalar.properties.generalCategory == .control
            result.append(misleading ? "_" : scalar)
        }
        return String(result)
    }

    private static func isBidirectionalControl(_ scalar: Unicode.Scalar) -> Bool {
        (0x202A...0x202E).contains(scalar.value) || (0x2066...0x2069).contains(scalar.value)
            || scalar.value == 0x200E || scalar.value == 0x200F || scalar.value == 0x061C
    }
}
