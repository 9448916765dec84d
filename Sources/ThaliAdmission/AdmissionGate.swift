import NIOCore

/// Why an ``AdmissionGate`` refused a connection.
public enum AdmissionRefusal: String, Error, Sendable, Hashable, Codable {
    /// The source exceeded ``AdmissionLimits/maxConnectionsPerSource`` and is in its refusal period.
    case sourceRate = "source-rate"
    /// The source holds ``AdmissionLimits/maxUnauthenticatedPerSource`` unauthenticated connections.
    case sourceUnauthenticated = "source-unauthenticated"
    /// The source holds ``AdmissionLimits/maxOpenPerSource`` connections.
    case sourceOpen = "source-open"
    /// ``AdmissionLimits/maxUnauthenticatedGlobal`` unauthenticated connections are open.
    case globalUnauthenticated = "global-unauthenticated"
    /// ``AdmissionLimits/maxOpenGlobal`` connections are open.
    case globalOpen = "global-open"
    /// This connection exceeded the global rate: the owner must close its port for
    /// ``AdmissionLimits/overloadClosePeriod`` (the last resort).
    case overloaded = "overloaded"
    /// The port is closed after an overload (a connection that was already queued in the kernel).
    case closedForOverload = "closed-for-overload"

    /// Whether the refusal is about one source only (it costs the other sources nothing).
    public var isPerSource: Bool {
        switch self {
        case .sourceRate, .sourceUnauthenticated, .sourceOpen: true
        case .globalUnauthenticated, .globalOpen, .overloaded, .closedForOverload: false
        }
    }
}

/// The decision about one incoming connection.
public enum AdmissionDecision: Sendable, Hashable {
    /// Serve it; it holds an unauthenticated slot until ``AdmissionGate/authenticated(_:)`` and a slot
    /// until ``AdmissionGate/closed(_:authenticated:)``.
    case admitted
    /// Close it at once.
    case refused(AdmissionRefusal)
}

/// Decides which incoming connections a port serves: per source first (rate, unauthenticated and open
/// connections), then for everyone (unauthenticated and open connections, and the global rate whose
/// excess closes the port for a while). A refusal for a per-source reason changes no global count, so
/// one abusive source cannot take the port from the others. A pure value: the owner keeps it behind a
/// lock and passes the time in, so every bound is testable without I/O. Memory is bounded by
/// ``AdmissionLimits/maxTrackedSources``.
///
/// One mechanism for every listener in the suite: the node's single port (beacon fetches and PSK-TLS),
/// the standalone beacon and PSK-TLS servers, and incoming Bluetooth connections.
public struct AdmissionGate<Source: Hashable & Sendable>: Sendable {
    private struct SourceState: Sendable {
        var window: RateWindow
        var refusedUntil: NIODeadline?
        var open = 0
        var unauthenticated = 0
    }

    /// The limits in force.
    public let limits: AdmissionLimits
    /// What the gate has done so far.
    public private(set) var counters = AdmissionCounters()
    /// Connections open now.
    public private(set) var open = 0
    /// Unauthenticated connections open now.
    public private(set) var unauthenticated = 0
    /// When the port reopens after an overload, while it is closed.
    public private(set) var closedUntil: NIODeadline?

    private var sources: [Source: SourceState] = [:]
    private var globalWindow: RateWindow
    /// Busy answers that gave their place in `globalWindow` back, per window.
    private var busyAnswersReturned: RateWindow

    /// A gate with `limits` (see ``AdmissionLimits/problem`` for limits that cannot work).
    public init(limits: AdmissionLimits = AdmissionLimits()) {
        self.limits = limits
        globalWindow = RateWindow(limit: limits.maxConnectionsGlobal, length: limits.globalWindow)
        busyAnswersReturned = RateWindow(limit: limits.maxBusyAnswersGlobal, length: limits.globalWindow)
    }

    /// Sources remembered now (at most ``AdmissionLimits/maxTrackedSources``).
    public var trackedSources: Int { sources.count }

    /// Connections `source` holds open now: (all, unauthenticated).
    public func openConnections(of source: Source) -> (open: Int, unauthenticated: Int) {
        sources[source].map { ($0.open, $0.unauthenticated) } ?? (0, 0)
    }

    /// The sources refused for their rate at `now` (each until the end of its refusal period), the
    /// latest refusals first: what a listener may refuse in the kernel too, since the gate refuses
    /// every connection of theirs until then whatever else happens.
    public func refusedSources(at now: NIODeadline) -> [(source: Source, until: NIODeadline)] {
        sources.compactMap { source, state in
            state.refusedUntil.flatMap { now < $0 ? (source, $0) : nil }
        }.sorted { $0.until > $1.until }
    }

    /// Whether the port is closed for an overload at `now`.
    public func isClosedForOverload(now: NIODeadline) -> Bool {
        closedUntil.map { now < $0 } ?? false
    }

    /// Whether the port is busy at `now`: more than ``AdmissionLimits/busyConnectionsGlobal`` connections
    /// admitted in the current global window, or more than ``AdmissionLimits/busyUnauthenticatedGlobal``
    /// unauthenticated ones open. A busy port still serves what it admitted; it asks beacon requesters to
    /// come back later, which costs both sides one small answer instead of a refusal they would retry.
    public func isBusy(at now: NIODeadline) -> Bool {
        if unauthenticated > limits.busyUnauthenticatedGlobal { return true }
        var window = globalWindow
        window.advance(to: now)
        return window.count > limits.busyConnectionsGlobal
    }

    /// Counts a request told to come back later (``isBusy(at:)``) at `now`: its connection's place in the
    /// global rate is given back, up to ``AdmissionLimits/maxBusyAnswersGlobal`` per window.
    public mutating func answeredBusy(at now: NIODeadline) {
        counters.busyAnswers += 1
        busyAnswersReturned.advance(to: now)
        guard !busyAnswersReturned.isFull else { return }
        busyAnswersReturned.add()
        globalWindow.remove()
    }

    /// Decides about a connection from `source` accepted at `now`.
    public mutating func admit(_ source: Source, now: NIODeadline) -> AdmissionDecision {
        if let until = closedUntil {
            if now < until { return refuse(.closedForOverload) }
            closedUntil = nil
        }
        // Per source, before anything global is touched.
        var state = sources[source]
            ?? SourceState(window: RateWindow(limit: limits.maxConnectionsPerSource, length: limits.sourceWindow))
        if let until = state.refusedUntil {
            if now < until {
                sources[source] = state
                return refuse(.sourceRate)
            }
            state.refusedUntil = nil
            state.window.restart()
        }
        state.window.advance(to: now)
        guard !state.window.isFull else {
            let period = limits.sourceRefusalPeriod > .zero ? TimeAmount(limits.sourceRefusalPeriod)
                : TimeAmount(limits.sourceWindow) - (now - (state.window.start ?? now))
            state.refusedUntil = now + period
            counters.sourcesRefused += 1
            remember(source, state, now: now)
            return refuse(.sourceRate)
        }
        guard state.unauthenticated < limits.maxUnauthenticatedPerSource else {
            remember(source, state, now: now)
            return refuse(.sourceUnauthenticated)
        }
        guard state.open < limits.maxOpenPerSource else {
            remember(source, state, now: now)
            return refuse(.sourceOpen)
        }
        // Global bounds: only connections every per-source bound let through get here.
        guard unauthenticated < limits.maxUnauthenticatedGlobal else {
            remember(source, state, now: now)
            return refuse(.globalUnauthenticated)
        }
        guard open < limits.maxOpenGlobal else {
            remember(source, state, now: now)
            return refuse(.globalOpen)
        }
        globalWindow.advance(to: now)
        guard !globalWindow.isFull else {
            closedUntil = now + TimeAmount(limits.overloadClosePeriod)
            counters.overloads += 1
            globalWindow.empty()
            remember(source, state, now: now)
            return refuse(.overloaded)
        }
        globalWindow.add()
        state.window.add()
        state.open += 1
        state.unauthenticated += 1
        open += 1
        unauthenticated += 1
        counters.admitted += 1
        remember(source, state, now: now)
        return .admitted
    }

    /// One of `source`'s unauthenticated connections authenticated: it no longer counts as unauthenticated.
    public mutating func authenticated(_ source: Source) {
        guard var state = sources[source], state.unauthenticated > 0 else { return }
        state.unauthenticated -= 1
        sources[source] = state
        unauthenticated -= 1
        counters.authenticated += 1
    }

    /// An admitted connection of `source` closed (`authenticated`: whether it had authenticated).
    public mutating func closed(_ source: Source, authenticated: Bool) {
        guard var state = sources[source], state.open > 0 else { return }
        state.open -= 1
        open -= 1
        if !authenticated, state.unauthenticated > 0 {
            state.unauthenticated -= 1
            unauthenticated -= 1
        }
        sources[source] = state
    }

    private mutating func refuse(_ reason: AdmissionRefusal) -> AdmissionDecision {
        switch reason {
        case .sourceRate: counters.refusedSourceRate += 1
        case .sourceUnauthenticated: counters.refusedSourceUnauthenticated += 1
        case .sourceOpen: counters.refusedSourceOpen += 1
        case .globalUnauthenticated: counters.refusedGlobalUnauthenticated += 1
        case .globalOpen: counters.refusedGlobalOpen += 1
        case .overloaded, .closedForOverload: counters.refusedOverload += 1
        }
        return .refused(reason)
    }

    /// Stores `state`, making room first when `source` is new and the table is full: sources with nothing
    /// open whose window and refusal ended go first, then those with nothing open and the oldest windows,
    /// an eighth of the table at once so that a stream of new sources costs amortised O(log n) each.
    /// Sources with open connections are never forgotten (there are at most `maxOpenGlobal` of them).
    private mutating func remember(_ source: Source, _ state: SourceState, now: NIODeadline) {
        if sources[source] == nil, sources.count >= limits.maxTrackedSources {
            let before = sources.count
            sources = sources.filter { _, entry in
                entry.open > 0 || entry.window.start.map { now - $0 < TimeAmount(limits.sourceWindow) } ?? false || (entry.refusedUntil.map { now < $0 } ?? false)
            }
            if sources.count >= limits.maxTrackedSources {
                let idle = sources.filter { $0.value.open == 0 }.sorted { ($0.value.window.start ?? now) < ($1.value.window.start ?? now) }
                let excess = sources.count - limits.maxTrackedSources + 1
                for (key, _) in idle.prefix(max(excess, limits.maxTrackedSources / 8)) { sources[key] = nil }
            }
            counters.sourcesForgotten += before - sources.count
        }
        sources[source] = state
    }
}
