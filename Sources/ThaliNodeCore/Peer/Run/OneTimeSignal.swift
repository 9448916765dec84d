import NIOConcurrencyHelpers

/// A gate that opens once and stays open: every wait before the signal returns at it, every wait after
/// it returns at once. A cancelled wait returns too (the gate stays shut for the others). Package-wide:
/// the peer's start and stop wait on it, and ThaliNodeBluetooth's binding for page scan.
package final class OneTimeSignal: Sendable {
    private struct State {
        var open = false
        var nextWaiter = 0
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
    }

    private let state = NIOLockedValueBox(State())

    /// A shut gate.
    package init() {}

    /// Opens the gate: wakes every wait.
    package func signal() {
        let waiters = state.withLockedValue { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Whether the gate is open.
    package var isOpen: Bool { state.withLockedValue { $0.open } }

    /// Returns once the gate is open, or when the task is cancelled.
    package func wait() async {
        let id = state.withLockedValue { state -> Int in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let now = state.withLockedValue { state -> Bool in
                    if state.open || Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            state.withLockedValue { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }
}
