import NIOConcurrencyHelpers

/// Hands every ``PeerEvent`` to each subscribed `AsyncStream`. A subscriber that falls behind loses its
/// oldest events, never blocks the peer: each stream buffers at most the count it asked for. The streams
/// finish after ``PeerEvent/stopped``.
final class PeerEventBroadcaster: Sendable {
    private struct State {
        var subscribers: [UInt64: AsyncStream<PeerEvent>.Continuation] = [:]
        var nextID: UInt64 = 0
        var finished = false
    }

    private let state = NIOLockedValueBox(State())

    /// A new stream of the events from now on, keeping at most `limit` unread ones.
    func subscribe(bufferingNewest limit: Int) -> AsyncStream<PeerEvent> {
        let (stream, continuation) = AsyncStream<PeerEvent>.makeStream(bufferingPolicy: .bufferingNewest(max(1, limit)))
        let id = state.withLockedValue { state -> UInt64? in
            guard !state.finished else { return nil }
            defer { state.nextID += 1 }
            state.subscribers[state.nextID] = continuation
            return state.nextID
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLockedValue { $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }

    /// Delivers `event` to every subscriber; after ``PeerEvent/stopped`` every stream ends.
    func yield(_ event: PeerEvent) {
        let subscribers = state.withLockedValue { state -> [AsyncStream<PeerEvent>.Continuation] in
            let current = Array(state.subscribers.values)
            if event == .stopped {
                state.finished = true
                state.subscribers.removeAll()
            }
            return current
        }
        for subscriber in subscribers {
            subscriber.yield(event)
            if event == .stopped { subscriber.finish() }
        }
    }
}
