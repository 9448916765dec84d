import NIOConcurrencyHelpers

/// Ends a wait early: a link task's backoff when a new match arrives, a beacon refetch pause when its
/// Bluetooth link ends. A signal given while nobody waits is kept for the next wait (at most one).
/// Package-wide: ThaliNodeBluetooth's binding waits on it too.
package final class LinkWakeSignal: Sendable {
    private struct State {
        var signalled = false
        /// The wait in progress: its number, and its continuation once installed.
        var waitID: UInt64 = 0
        var waiter: CheckedContinuation<Void, Never>?
        /// The wait whose time ran out (or was cancelled) before its continuation was installed.
        var expiredBeforeInstalled: UInt64?
    }

    private let state = NIOLockedValueBox(State())

    /// No signal kept, nobody waiting.
    package init() {}

    /// Wakes the current wait, or the next one.
    package func signal() {
        resumeWaiter { $0.signalled = true }
    }

    /// Returns after `delay`, at a signal, or when the task is cancelled, whichever comes first.
    package func wait(upTo delay: Duration) async {
        let id = state.withLockedValue { state -> UInt64 in
            state.waitID &+= 1
            state.expiredBeforeInstalled = nil
            return state.waitID
        }
        // The timer is a child of this wait: it ends with it, and with the waiting task's cancellation.
        await withTaskGroup(of: Void.self) { group in
            group.addTask { [self] in
                guard (try? await Task.sleep(for: delay)) != nil else { return }
                expire(id)
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { continuation in
                    let now = state.withLockedValue { state -> Bool in
                        if state.signalled || state.expiredBeforeInstalled == id {
                            state.signalled = false
                            return true
                        }
                        state.waiter = continuation
                        return false
                    }
                    if now { continuation.resume() }
                }
            } onCancel: {
                expire(id)
            }
            group.cancelAll()
        }
    }

    /// Whether a wait is blocked on its continuation, neither signalled nor expired: what tests wait for
    /// before they signal "during" a wait, or conclude that a wait did not return at once.
    package var isWaiting: Bool { state.withLockedValue { $0.waiter != nil } }

    /// Ends wait `id` (its time ran out, or its task was cancelled) without leaving a signal behind.
    private func expire(_ id: UInt64) {
        resumeWaiter(if: { $0.waitID == id }) { $0.expiredBeforeInstalled = id }
    }

    /// Resumes the installed waiter when `condition` holds; with no waiter installed yet, applies
    /// `otherwise` so that the wait about to install one returns at once.
    private func resumeWaiter(if condition: (State) -> Bool = { _ in true }, otherwise: (inout State) -> Void) {
        let waiter = state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
            guard condition(state) else { return nil }
            guard let waiter = state.waiter else {
                otherwise(&state)
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume()
    }
}
