import Foundation

/// What a delivery session reports as it goes, for progress displays and logs.
public enum DeliveryEvent: Sendable, Hashable {
    /// Sender: item offered.
    case offered(ItemOffer)
    /// Both sides: content of item `id` starts moving at `offset` (> 0: resumed) of `total` bytes.
    case transferStarted(id: UUID, offset: UInt64, total: UInt64)
    /// Both sides: `bytes` of `total` of item `id` have been sent / received.
    case progress(id: UUID, bytes: UInt64, total: UInt64)
    /// Sender: item `id` is delivered and removed from the outbox (`alreadyStored`: it was in the
    /// receiver's inbox from an earlier session).
    case delivered(id: UUID, alreadyStored: Bool)
    /// Sender: the receiver refused the item for good (it is kept, marked refused, never offered again).
    case refused(ItemOffer, ItemRefusal)
    /// Sender, version 4: the receiver cannot hold the item now (``ItemRefusal/noSpace``); it stays
    /// pending and is offered again after `retryIn`.
    case deferred(ItemOffer, ItemRefusal, retryIn: Duration)
    /// Receiver: this node refused the offered item, `reason` saying why in words with the limit and the
    /// size ("larger than this node's limit of 1.0 MiB (maxItemBytes)", "not enough space: ...").
    case refusedOffer(ItemOffer, ItemRefusal, reason: String)
    /// Sender: the receiver rejected the content of item `id` as damaged in transit; the sender keeps
    /// the item and sends it again in a later session.
    case rejected(id: UUID, TransferFailure)
    /// Receiver: the content of item `id` arrived damaged and was discarded; the sender sends it again.
    case discarded(id: UUID, TransferFailure)
    /// Receiver: an item was committed to the inbox.
    case received(InboxItem)
    /// Receiver: item `id` was offered again but is already in the inbox.
    case duplicate(id: UUID)
}

/// A callback for ``DeliveryEvent``s. It runs on the session's task; keep it short.
public typealias DeliveryEventHandler = @Sendable (DeliveryEvent) -> Void

/// Delivery events as an `AsyncStream`, for progress displays that iterate.
public enum DeliveryEvents {
    /// A stream of events and the handler that feeds it (pass it as a session's `events`); call `finish`
    /// on the continuation when the sessions are over. The stream buffers at most `bufferLimit` events,
    /// dropping the oldest, so a slow reader cannot grow memory without bound.
    public static func makeStream(bufferLimit: Int = 1024)
        -> (stream: AsyncStream<DeliveryEvent>, handler: DeliveryEventHandler, continuation: AsyncStream<DeliveryEvent>.Continuation) {
        let (stream, continuation) = AsyncStream.makeStream(of: DeliveryEvent.self, bufferingPolicy: .bufferingNewest(bufferLimit))
        return (stream, { event in continuation.yield(event) }, continuation)
    }
}

extension DeliveryEvent {
    /// Whether the event says an item moved forward on the receiving side: bytes of it were stored
    /// (`progress`) or it was committed (`received`).
    var movesAnItemForward: Bool {
        switch self {
        case .progress, .received: true
        default: false
        }
    }
}
