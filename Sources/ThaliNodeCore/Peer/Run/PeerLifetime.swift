import NIOConcurrencyHelpers

/// The peer's one lifetime task: a discarding task group that owns every task the peer runs (each
/// link, each session's delivery, announcement rotation, store checks), fed through a command stream as
/// `PeerBluetoothBinding`'s lifetime is. Timers are deadlines: the group keeps one sleeper for the earliest
/// deadline it was told of, and when that passes it calls `onDeadline`, which fires what is due (from a
/// ``PeerSchedule``) and tells of the next deadline. Ending the lifetime cancels and awaits every task.
final class PeerLifetime: Sendable {
    private enum Command: Sendable {
        /// Run this as a child of the group.
        case run(@Sendable () async -> Void)
        /// Wake at this instant (if no sleeper wakes earlier).
        case wake(at: ContinuousClock.Instant)
        /// A sleeper's instant has come.
        case woke(ContinuousClock.Instant)
    }

    private struct State {
        var task: Task<Void, Never>?
        var ended = false
    }

    private let commands: AsyncStream<Command>
    private let continuation: AsyncStream<Command>.Continuation
    private let state = NIOLockedValueBox(State())

    init() {
        (commands, continuation) = AsyncStream.makeStream(of: Command.self)
    }

    /// A peer dropped without a stop (its start failed, say) leaves no task behind.
    deinit {
        continuation.finish()
        state.withLockedValue { $0.task }?.cancel()
    }

    /// Starts the lifetime task; `onDeadline` runs (in the lifetime task, keep it short) each time a
    /// deadline told of by ``wake(at:)`` has passed. Once only; not after ``end()``.
    func start(onDeadline: @escaping @Sendable () -> Void) {
        let commands = self.commands
        let continuation = self.continuation
        state.withLockedValue { state in
            guard state.task == nil, !state.ended else { return }
            state.task = Task {
                await withDiscardingTaskGroup { group in
                    // The instant the earliest sleeper wakes at: a later deadline needs no sleeper of its own,
                    // since `onDeadline` tells of the next one when that sleeper wakes.
                    var sleeperWakesAt: ContinuousClock.Instant?
                    for await command in commands {
                        switch command {
                        case .run(let body):
                            group.addTask { await body() }
                        case .wake(let instant):
                            if let sleeper = sleeperWakesAt, sleeper <= instant { continue }
                            sleeperWakesAt = instant
                            group.addTask {
                                // Cancelled when the lifetime ends: then it tells nothing.
                                guard (try? await Task.sleep(until: instant, clock: .continuous)) != nil else { return }
                                continuation.yield(.woke(instant))
                            }
                        case .woke(let instant):
                            if sleeperWakesAt == instant { sleeperWakesAt = nil }
                            onDeadline()
                        }
                    }
                    group.cancelAll()
                }
            }
        }
    }

    /// Runs `body` as a task of the lifetime: cancelled and awaited when it ends. Returns false (and runs
    /// nothing) once the lifetime has ended.
    @discardableResult
    func run(_ body: @escaping @Sendable () async -> Void) -> Bool {
        guard !state.withLockedValue({ $0.ended }) else { return false }
        if case .terminated = continuation.yield(.run(body)) { return false }
        return true
    }

    /// Asks for `onDeadline` at `instant` (or as soon as the lifetime reaches it, if it has passed).
    func wake(at instant: ContinuousClock.Instant) {
        continuation.yield(.wake(at: instant))
    }

    /// Ends the lifetime: no new task, every task cancelled, and returns once all have returned.
    func end() async {
        let task = state.withLockedValue { state -> Task<Void, Never>? in
            state.ended = true
            return state.task
        }
        continuation.finish()
        task?.cancel()
        await task?.value
    }
}
