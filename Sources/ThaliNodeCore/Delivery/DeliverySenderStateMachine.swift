import Foundation
import NIOCore
import ThaliMutants

/// The sending side of a delivery session as a pure state machine: the driver tells it which item it
/// offers and feeds it the receiver's frames and the results of local I/O; it returns the next action.
///
/// hello → welcome (the receiver's frame maximum), then per item: offer → answer (nothing / partial /
/// complete / refused) → [verify the partial's prefix] → start, data…, end → ack (remove the item) or
/// reject (keep it for a later session). From version 3 the receiver reports `progress` while content
/// streams, and texts may go as a batch of `item` frames, answered in order. An `error` frame from the
/// receiver ends the session in any state. From version 4 a receiver may refuse an item for now
/// (``ItemRefusal/noSpace``): the item stays pending, to be offered again later, and the session goes on.
public struct DeliverySenderStateMachine: Sendable {
    /// The states of the sending side.
    public enum State: Sendable, Hashable {
        /// `hello` not sent yet.
        case initial
        /// `hello` sent; waiting for the receiver's `welcome`.
        case awaitingWelcome
        /// May offer the next item or finish.
        case ready
        /// Offered an item; waiting for the answer.
        case awaitingAnswer(ItemOffer)
        /// The receiver holds a prefix of `offset` bytes; checking its digest against our content.
        case verifyingPrefix(ItemOffer, offset: UInt64)
        /// Streaming content from `offset`.
        case streaming(ItemOffer, offset: UInt64)
        /// All content sent; waiting for `ack` or `reject`.
        case awaitingAck(ItemOffer)
        /// A batch of `item` frames sent; waiting for their answers, in this order.
        case awaitingBatchAnswers([ItemOffer])
        /// `done` sent.
        case finished
        /// A protocol error ended the session.
        case failed
    }

    /// What the driver must do next.
    public enum Action: Sendable, Hashable {
        /// The receiver speaks version 2 and accepts frame payloads up to `maxFramePayloadBytes`: keep data
        /// chunks within it, then offer.
        case welcomed(maxFramePayloadBytes: Int)
        /// The receiver holds `bytes` of the item being streamed (written, not yet durable): report them.
        case progressed(ItemOffer, bytes: UInt64)
        /// Compare the SHA-256 of the first `offset` bytes of the item with `digest`; call
        /// ``prefixVerified(matches:)``.
        case verifyPrefix(ItemOffer, offset: UInt64, digest: [UInt8])
        /// Send `start` at `offset`, then the content from there in chunks, then call ``contentSent()``.
        case stream(ItemOffer, offset: UInt64)
        /// The receiver has the item (`alreadyStored`: from an earlier session): remove it from the outbox.
        case delivered(ItemOffer, alreadyStored: Bool)
        /// The receiver refuses the item: mark it refused, never offer it again.
        case refused(ItemOffer, ItemRefusal)
        /// Version 4: the receiver cannot hold the item now (``ItemRefusal/noSpace``): keep it pending,
        /// offer it again after a wait, and go on with the next item.
        case deferred(ItemOffer, ItemRefusal)
        /// The receiver discarded the transferred content: keep the item for a later session.
        case rejected(ItemOffer, TransferFailure)
    }

    /// The current state.
    public private(set) var state: State = .initial
    /// The largest frame payload the receiver accepts, from its `welcome` (nil before).
    public private(set) var receiverMaxFramePayloadBytes: Int?

    /// Whether the receiver understands `error` frames (it answered `hello` with `welcome`).
    public var receiverHearsErrors: Bool { receiverMaxFramePayloadBytes != nil }
    /// The version the receiver welcomed us with (nil before).
    public private(set) var version: UInt8?
    /// The receiver's progress window (version 3): content bytes sent beyond its last `progress` stay
    /// within it. Nil: no window (version 2, which sends no `progress`).
    public private(set) var progressWindowBytes: Int?
    /// Whether the receiver reports progress and takes batches of `item` frames (version 3).
    public var receiverSpeaksProgress: Bool { progressWindowBytes != nil }
    /// How long the receiver keeps the stream open once everything is answered (version 5; nil
    /// before): the sender may wait that long, at most, for new items before it sends `done`.
    public private(set) var receiverLinger: Duration?
    /// The receiver's last reported progress of the item being streamed.
    public private(set) var reportedBytes: UInt64 = 0

    /// Creates a sender in the `initial` state.
    public init() {}

    /// Opens the session: the `hello` frame to send.
    public mutating func start() throws -> DeliveryFrame {
        guard state == .initial else { return try fail(.unexpectedFrame(frame: "hello", state: stateName)) }
        if Mutant.deliverySenderSpeaksVersion1.isActive {
            // A sender from before the welcome frame: it offers at once and hears no errors.
            (state, version) = (.ready, 1)
            return .hello(version: 1)
        }
        state = .awaitingWelcome
        return .hello(version: DeliveryFrame.protocolVersion)
    }

    /// Offers `offer`: the frame to send.
    public mutating func offer(_ offer: ItemOffer) throws -> DeliveryFrame {
        guard state == .ready else { return try fail(.unexpectedFrame(frame: "offer", state: stateName)) }
        state = .awaitingAnswer(offer)
        return .offer(offer)
    }

    /// Offers a batch of texts whole (version 3), each with its content: the `item` frames to send, the
    /// last one marked. Their answers come in the same order.
    package mutating func offerBatch(_ items: [(offer: ItemOffer, content: ByteBuffer)]) throws -> [DeliveryFrame] {
        // A batch may follow others not answered yet: their answers come in the order the items went.
        let unanswered: [ItemOffer]
        switch state {
        case .ready: unanswered = []
        case .awaitingBatchAnswers(let offers): unanswered = offers
        default: return try fail(.unexpectedFrame(frame: "item", state: stateName))
        }
        guard receiverSpeaksProgress, !items.isEmpty,
              items.allSatisfy({ $0.offer.kind == .text && UInt64($0.content.readableBytes) == $0.offer.size })
        else { return try fail(.unexpectedFrame(frame: "item", state: stateName)) }
        state = .awaitingBatchAnswers(unanswered + items.map(\.offer))
        return items.indices.map { .item(items[$0].offer, content: items[$0].content, endsBatch: $0 == items.count - 1) }
    }

    /// Ends the session: the `done` frame to send.
    public mutating func finish() throws -> DeliveryFrame {
        guard state == .ready else { return try fail(.unexpectedFrame(frame: "done", state: stateName)) }
        state = .finished
        return .done
    }

    /// Feeds one frame from the receiver.
    public mutating func receive(_ frame: DeliveryFrame) throws -> Action {
        switch (state, frame) {
        case (.finished, _), (.failed, _):
            return try fail(.unexpectedFrame(frame: frame.name, state: stateName))
        case (_, .error(let code, let reason)):
            return try fail(.peerReported(code: code, reason: reason, peer: nil, subject: subject))
        case (.awaitingWelcome, .welcome(let version, let maximum, let window, let linger)):
            // A version 2 receiver welcomes us with 2: we speak 2 with it (no progress, no batches).
            guard (2...DeliveryFrame.protocolVersion).contains(version) else { return try fail(.unsupportedVersion(version)) }
            guard maximum >= DeliveryLimits.minimumFramePayloadBytes else {
                return try fail(.malformedFrame(type: "welcome", reason: "frame maximum \(maximum) below \(DeliveryLimits.minimumFramePayloadBytes)"))
            }
            if let window, window < 2 * DeliveryLimits.minimumFramePayloadBytes {
                return try fail(.malformedFrame(type: "welcome", reason: "progress window \(window) below \(2 * DeliveryLimits.minimumFramePayloadBytes)"))
            }
            self.version = version
            progressWindowBytes = window.map(Int.init)
            receiverLinger = linger.map { .milliseconds(Int64($0)) }
            receiverMaxFramePayloadBytes = Int(maximum)
            state = .ready
            return .welcomed(maxFramePayloadBytes: Int(maximum))
        case (.awaitingAnswer(let offer), .answer(let id, let answer)):
            guard id == offer.id else { return try fail(.itemMismatch(expected: offer.id, received: id)) }
            switch answer {
            case .complete:
                state = .ready
                return .delivered(offer, alreadyStored: true)
            case .refused(let reason):
                let action = try refusal(of: offer, reason)
                state = .ready
                return action
            case .nothing:
                state = .streaming(offer, offset: 0)
                reportedBytes = 0
                return .stream(offer, offset: 0)
            case .partial(let offset, let digest):
                guard offset <= offer.size, digest.count == 32 else {
                    state = .streaming(offer, offset: 0)
                    reportedBytes = 0
                    return .stream(offer, offset: 0)
                }
                state = .verifyingPrefix(offer, offset: offset)
                return .verifyPrefix(offer, offset: offset, digest: digest)
            }
        case (.streaming(let offer, _), .progress(let id, let bytes)), (.awaitingAck(let offer), .progress(let id, let bytes)):
            guard receiverSpeaksProgress else { return try fail(.unexpectedFrame(frame: frame.name, state: stateName)) }
            guard id == offer.id else { return try fail(.itemMismatch(expected: offer.id, received: id)) }
            // Each report moves forward and stays within the item: a receiver cannot make us report more.
            guard bytes > reportedBytes, bytes <= offer.size else {
                return try fail(.malformedFrame(type: "progress", reason: "\(bytes) bytes after \(reportedBytes) of \(offer.size)"))
            }
            reportedBytes = bytes
            return .progressed(offer, bytes: bytes)
        case (.awaitingBatchAnswers(var offers), _):
            let offer = offers.removeFirst()
            let action: Action
            switch frame {
            case .ack(let id) where id == offer.id: action = .delivered(offer, alreadyStored: false)
            case .answer(let id, .complete) where id == offer.id: action = .delivered(offer, alreadyStored: true)
            case .answer(let id, .refused(let reason)) where id == offer.id: action = try refusal(of: offer, reason)
            case .reject(let id, let failure) where id == offer.id: action = .rejected(offer, failure)
            case .ack(let id), .answer(let id, _), .reject(let id, _):
                return try fail(id == offer.id ? .unexpectedFrame(frame: frame.name, state: stateName) : .itemMismatch(expected: offer.id, received: id))
            default:
                return try fail(.unexpectedFrame(frame: frame.name, state: stateName))
            }
            state = offers.isEmpty ? .ready : .awaitingBatchAnswers(offers)
            return action
        case (.awaitingAck(let offer), .ack(let id)):
            guard id == offer.id else { return try fail(.itemMismatch(expected: offer.id, received: id)) }
            state = .ready
            return .delivered(offer, alreadyStored: false)
        case (.awaitingAck(let offer), .reject(let id, let failure)):
            guard id == offer.id else { return try fail(.itemMismatch(expected: offer.id, received: id)) }
            state = .ready
            return .rejected(offer, failure)
        default:
            return try fail(.unexpectedFrame(frame: frame.name, state: stateName))
        }
    }

    /// What a refusal of `offer` asks: a permanent one marks it refused, a temporary one (version 4 only;
    /// an older receiver cannot send it) defers it.
    private mutating func refusal(of offer: ItemOffer, _ reason: ItemRefusal) throws -> Action {
        guard reason.isTemporary else { return .refused(offer, reason) }
        guard (version ?? 0) >= reason.sinceVersion else {
            return try fail(.malformedFrame(type: "answer", reason: "refusal \(reason.rawValue) from a version \(version ?? 0) receiver"))
        }
        return .deferred(offer, reason)
    }

    /// Reports whether our first `offset` bytes have the receiver's digest: resume there, or restart.
    public mutating func prefixVerified(matches: Bool) throws -> Action {
        guard case .verifyingPrefix(let offer, let offset) = state else {
            return try fail(.unexpectedFrame(frame: "prefix check", state: stateName))
        }
        let from = matches ? offset : 0
        state = .streaming(offer, offset: from)
        reportedBytes = from
        return .stream(offer, offset: from)
    }

    /// Reports that all content was sent: the `end` frame to send.
    public mutating func contentSent() throws -> DeliveryFrame {
        guard case .streaming(let offer, _) = state else { return try fail(.unexpectedFrame(frame: "end", state: stateName)) }
        state = .awaitingAck(offer)
        return .end(id: offer.id)
    }

    /// Reports the end of the byte stream; an error unless the session had finished.
    public mutating func streamEnded() throws {
        if state != .finished { try fail(.connectionClosed(state: stateName)) as Void }
    }

    /// Fails the session with `error` (whatever the caller would have returned).
    private mutating func fail<Result>(_ error: DeliveryProtocolError) throws -> Result {
        state = .failed
        throw error
    }

    /// What the receiver refuses when it reports an error now: the item in progress, or nil (the session).
    private var subject: String? {
        switch state {
        case .awaitingAnswer(let offer), .verifyingPrefix(let offer, _), .streaming(let offer, _), .awaitingAck(let offer):
            offer.kind == .file ? "the file \"\(offer.name)\"" : "the text"
        case .awaitingBatchAnswers(let offers): offers.count == 1 ? "the text" : "\(offers.count) texts"
        default: nil
        }
    }

    /// The state's name, for errors.
    package var stateName: String {
        switch state {
        case .initial: "starting"
        case .awaitingWelcome: "awaiting the receiver's welcome"
        case .ready: "ready to offer"
        case .awaitingAnswer: "awaiting an answer"
        case .verifyingPrefix: "verifying a prefix"
        case .streaming: "streaming"
        case .awaitingAck: "awaiting an acknowledgement"
        case .awaitingBatchAnswers: "awaiting the answers to a batch"
        case .finished: "finished"
        case .failed: "failed"
        }
    }
}
