import Foundation

/// The sending side of a delivery session as a pure state machine: the driver tells it which item it
/// offers and feeds it the receiver's frames and the results of local I/O; it returns the next action.
///
/// hello → welcome (the receiver's frame maximum), then per item: offer → answer (nothing / partial /
/// complete / refused) → [verify the partial's prefix] → start, data…, end → ack (remove the item) or
/// reject (keep it for a later session). An `error` frame from the receiver ends the session in any state.
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
        /// Compare the SHA-256 of the first `offset` bytes of the item with `digest`; call
        /// ``prefixVerified(matches:)``.
        case verifyPrefix(ItemOffer, offset: UInt64, digest: [UInt8])
        /// Send `start` at `offset`, then the content from there in chunks, then call ``contentSent()``.
        case stream(ItemOffer, offset: UInt64)
        /// The receiver has the item (`alreadyStored`: from an earlier session): remove it from the outbox.
        case delivered(ItemOffer, alreadyStored: Bool)
        /// The receiver refuses the item: mark it refused, never offer it again.
        case refused(ItemOffer, ItemRefusal)
        /// The receiver discarded the transferred content: keep the item for a later session.
        case rejected(ItemOffer, TransferFailure)
    }

    /// The current state.
    public private(set) var state: State = .initial
    /// The largest frame payload the receiver accepts, from its `welcome` (nil before).
    public private(set) var receiverMaxFramePayloadBytes: Int?

    /// Whether the receiver understands `error` frames (it answered `hello` with `welcome`).
    public var receiverHearsErrors: Bool { receiverMaxFramePayloadBytes != nil }

    /// Creates a sender in the `initial` state.
    public init() {}

    /// Opens the session: the `hello` frame to send.
    public mutating func start() throws -> DeliveryFrame {
        guard state == .initial else { return try failFrame(.unexpectedFrame(frame: "hello", state: stateName)) }
        state = .awaitingWelcome
        return .hello(version: DeliveryFrame.protocolVersion)
    }

    /// Offers `offer`: the frame to send.
    public mutating func offer(_ offer: ItemOffer) throws -> DeliveryFrame {
        guard state == .ready else { return try failFrame(.unexpectedFrame(frame: "offer", state: stateName)) }
        state = .awaitingAnswer(offer)
        return .offer(offer)
    }

    /// Ends the session: the `done` frame to send.
    public mutating func finish() throws -> DeliveryFrame {
        guard state == .ready else { return try failFrame(.unexpectedFrame(frame: "done", state: stateName)) }
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
        case (.awaitingWelcome, .welcome(let version, let maximum)):
            guard version == DeliveryFrame.protocolVersion else { return try fail(.unsupportedVersion(version)) }
            guard maximum >= DeliveryLimits.minimumFramePayloadBytes else {
                return try fail(.malformedFrame(type: "welcome", reason: "frame maximum \(maximum) below \(DeliveryLimits.minimumFramePayloadBytes)"))
            }
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
                state = .ready
                return .refused(offer, reason)
            case .nothing:
                state = .streaming(offer, offset: 0)
                return .stream(offer, offset: 0)
            case .partial(let offset, let digest):
                guard offset <= offer.size, digest.count == 32 else {
                    state = .streaming(offer, offset: 0)
                    return .stream(offer, offset: 0)
                }
                state = .verifyingPrefix(offer, offset: offset)
                return .verifyPrefix(offer, offset: offset, digest: digest)
            }
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

    /// Reports whether our first `offset` bytes have the receiver's digest: resume there, or restart.
    public mutating func prefixVerified(matches: Bool) throws -> Action {
        guard case .verifyingPrefix(let offer, let offset) = state else {
            return try fail(.unexpectedFrame(frame: "prefix check", state: stateName))
        }
        let from = matches ? offset : 0
        state = .streaming(offer, offset: from)
        return .stream(offer, offset: from)
    }

    /// Reports that all content was sent: the `end` frame to send.
    public mutating func contentSent() throws -> DeliveryFrame {
        guard case .streaming(let offer, _) = state else { return try failFrame(.unexpectedFrame(frame: "end", state: stateName)) }
        state = .awaitingAck(offer)
        return .end(id: offer.id)
    }

    /// Reports the end of the byte stream; an error unless the session had finished.
    public mutating func streamEnded() throws {
        if state != .finished { _ = try fail(.connectionClosed(state: stateName)) }
    }

    private mutating func fail(_ error: DeliveryProtocolError) throws -> Action {
        state = .failed
        throw error
    }

    private mutating func failFrame(_ error: DeliveryProtocolError) throws -> DeliveryFrame {
        state = .failed
        throw error
    }

    /// What the receiver refuses when it reports an error now: the item in progress, or nil (the session).
    private var subject: String? {
        switch state {
        case .awaitingAnswer(let offer), .verifyingPrefix(let offer, _), .streaming(let offer, _), .awaitingAck(let offer):
            offer.kind == .file ? "the file \"\(offer.name)\"" : "the text"
        default: nil
        }
    }

    /// The state's name, for errors.
    public var stateName: String {
        switch state {
        case .initial: "starting"
        case .awaitingWelcome: "awaiting the receiver's welcome"
        case .ready: "ready to offer"
        case .awaitingAnswer: "awaiting an answer"
        case .verifyingPrefix: "verifying a prefix"
        case .streaming: "streaming"
        case .awaitingAck: "awaiting an acknowledgement"
        case .finished: "finished"
        case .failed: "failed"
        }
    }
}
