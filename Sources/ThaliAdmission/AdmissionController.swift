import NIOConcurrencyHelpers
import NIOCore

/// An ``AdmissionGate`` shared by the event loops of one listener: it locks the gate, reads the clock,
/// and hands out an ``AdmissionTicket`` for every admitted connection, which gives the connection's slots
/// back exactly once. When a connection exceeds the global rate it tells `onOverload` how long the
/// listener must stay closed (the last resort).
public final class AdmissionController<Source: Hashable & Sendable>: Sendable {
    /// The limits in force.
    public let limits: AdmissionLimits
    private let gate: NIOLockedValueBox<AdmissionGate<Source>>
    private let onOverload: @Sendable (Duration) -> Void
    private let observers = NIOLockedValueBox(RefusalObservers())

    private struct RefusalObservers {
        var next = 0
        var byID: [Int: @Sendable () -> Void] = [:]
    }

    /// A controller enforcing `limits`; `onOverload` is called (outside the lock) when the global rate
    /// is exceeded, with the period the owner should close its port for.
    public init(limits: AdmissionLimits = AdmissionLimits(), onOverload: @escaping @Sendable (Duration) -> Void = { _ in }) {
        self.limits = limits
        self.gate = NIOLockedValueBox(AdmissionGate(limits: limits))
        self.onOverload = onOverload
    }

    /// What the gate has done so far.
    public var counters: AdmissionCounters { gate.withLockedValue { $0.counters } }
    /// Connections open now.
    public var openConnections: Int { gate.withLockedValue { $0.open } }
    /// Connections `source` holds open now.
    public func openConnections(of source: Source) -> Int { gate.withLockedValue { $0.openConnections(of: source).open } }
    /// Unauthenticated connections open now.
    public var unauthenticatedConnections: Int { gate.withLockedValue { $0.unauthenticated } }
    /// Sources remembered now.
    public var trackedSources: Int { gate.withLockedValue { $0.trackedSources } }

    /// Whether the port is closed for an overload now.
    public func isClosedForOverload(now: NIODeadline = .now()) -> Bool {
        gate.withLockedValue { $0.isClosedForOverload(now: now) }
    }

    /// The sources refused for their rate at `now`, the latest refusals first, with the end of each
    /// refusal period (see ``AdmissionGate/refusedSources(at:)``).
    public func refusedSources(now: NIODeadline = .now()) -> [(source: Source, until: NIODeadline)] {
        gate.withLockedValue { $0.refusedSources(at: now) }
    }

    /// Calls `observer` (outside the gate's lock, on the admitting thread) whenever a source's refusal
    /// period starts or a source is forgotten: a listener that refuses those sources in the kernel
    /// (``ListenerSourceFilter``) reads ``refusedSources(now:)`` again then. The end of a refusal period
    /// is not reported (nothing happens then); the observer knows it from ``refusedSources(now:)``.
    /// Returns the id for ``removeRefusedSourcesObserver(_:)``.
    public func addRefusedSourcesObserver(_ observer: @escaping @Sendable () -> Void) -> Int {
        observers.withLockedValue { observers in
            defer { observers.next += 1 }
            observers.byID[observers.next] = observer
            return observers.next
        }
    }

    /// Stops calling the observer `id` (from ``addRefusedSourcesObserver(_:)``).
    public func removeRefusedSourcesObserver(_ id: Int) {
        _ = observers.withLockedValue { $0.byID.removeValue(forKey: id) }
    }

    /// When the port is busy at `now` (``AdmissionGate/isBusy(at:)``): the seconds a beacon requester should
    /// wait before it asks again, drawn from 1 to ``AdmissionLimits/maxBusyRetryAfter`` (counted in
    /// ``AdmissionCounters/busyAnswers``); nil when it is not busy.
    public func retryAfterIfBusy(now: NIODeadline = .now()) -> Int? {
        let busy = gate.withLockedValue { gate -> Bool in
            guard gate.isBusy(at: now) else { return false }
            gate.answeredBusy(at: now)
            return true
        }
        guard busy else { return nil }
        let longest = max(1, Int(limits.maxBusyRetryAfter.components.seconds))
        return Int.random(in: 1...longest)
    }

    /// Decides about a connection from `source`: a ticket when admitted (release it when the connection
    /// closes, e.g. with ``AdmissionTicket/release(when:)``), else why it must be closed at once.
    public func admit(_ source: Source, now: NIODeadline = .now()) -> Result<AdmissionTicket<Source>, AdmissionRefusal> {
        let (decision, refusalsChanged) = gate.withLockedValue { gate in
            let before = (gate.counters.sourcesRefused, gate.counters.sourcesForgotten)
            let decision = gate.admit(source, now: now)
            return (decision, before != (gate.counters.sourcesRefused, gate.counters.sourcesForgotten))
        }
        // A refusal period started (or a source was forgotten, perhaps one in its refusal period).
        if refusalsChanged {
            for observer in observers.withLockedValue({ Array($0.byID.values) }) { observer() }
        }
        switch decision {
        case .admitted:
            return .success(AdmissionTicket(source: source, gate: gate))
        case .refused(let reason):
            if reason == .overloaded { onOverload(limits.overloadClosePeriod) }
            return .failure(reason)
        }
    }
}

/// One admitted connection's claim on its gate: an open slot, and an unauthenticated slot until
/// ``authenticated()``. ``release()`` gives both back; it and ``authenticated()`` take effect once.
public final class AdmissionTicket<Source: Hashable & Sendable>: Sendable {
    private enum State { case unauthenticated, authenticated, released }

    /// The source the connection came from.
    public let source: Source
    private let gate: NIOLockedValueBox<AdmissionGate<Source>>
    private let state = NIOLockedValueBox(State.unauthenticated)

    fileprivate init(source: Source, gate: NIOLockedValueBox<AdmissionGate<Source>>) {
        self.source = source
        self.gate = gate
    }

    /// The connection authenticated (a PSK-TLS handshake succeeded): it no longer holds an
    /// unauthenticated slot.
    public func authenticated() {
        let changed = state.withLockedValue { state -> Bool in
            guard state == .unauthenticated else { return false }
            state = .authenticated
            return true
        }
        if changed { gate.withLockedValue { $0.authenticated(source) } }
    }

    /// The connection closed: its slots are free again.
    public func release() {
        let previous = state.withLockedValue { state -> State in
            defer { state = .released }
            return state
        }
        guard previous != .released else { return }
        gate.withLockedValue { $0.closed(source, authenticated: previous == .authenticated) }
    }

    /// Releases the ticket when `closeFuture` completes (pass a channel's `closeFuture`).
    public func release(when closeFuture: EventLoopFuture<Void>) {
        closeFuture.whenComplete { [self] _ in release() }
    }
}
