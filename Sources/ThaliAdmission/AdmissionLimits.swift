import NIOCore

/// The bounds an ``AdmissionGate`` enforces on incoming connections, per source first and then for
/// everyone (the seed's "Denial of Service": filter excessive requesters; close the port only when that
/// is not enough). Every bound is configurable and counted in ``AdmissionCounters``.
///
/// A connection is *unauthenticated* from the moment it is admitted until its owner calls
/// ``AdmissionGate/authenticated(_:)`` (for a PSK-TLS connection: the handshake succeeded). A beacon
/// fetch never authenticates: it holds an unauthenticated slot for its short life. The unauthenticated
/// bounds are what keep strangers from holding the port with handshakes that cost us a DH key each.
public struct AdmissionLimits: Sendable, Hashable {
    /// Connections admitted from one source per ``sourceWindow``. Default 30: a Thali peer needs one
    /// beacon fetch and one TLS connection per announcement it matches, plus a few retries.
    public var maxConnectionsPerSource: Int = 30
    /// The per-source rate window. Default 10 s.
    public var sourceWindow: Duration = .seconds(10)
    /// How long a source that exceeded ``maxConnectionsPerSource`` is refused outright (0: only until its
    /// window ends). Default 60 s. Refusing costs nothing global; on a listener with a
    /// ``ListenerSourceFilter`` the kernel drops the source's SYNs, so not even an accept.
    public var sourceRefusalPeriod: Duration = .seconds(60)
    /// Unauthenticated connections one source may hold open at once. Default 4.
    public var maxUnauthenticatedPerSource: Int = 4
    /// Connections (authenticated or not) one source may hold open at once. Default 16.
    public var maxOpenPerSource: Int = 16
    /// Unauthenticated connections open at once from all sources. Default 32.
    public var maxUnauthenticatedGlobal: Int = 32
    /// Connections open at once from all sources. Default 128.
    public var maxOpenGlobal: Int = 128
    /// Connections admitted from all sources per ``globalWindow``. Exceeding it is the last resort: the
    /// owner closes its port for ``overloadClosePeriod``. Only connections that passed every per-source
    /// bound count, so one abusive source can never trigger it. Default 1,000 per 5 s.
    public var maxConnectionsGlobal: Int = 1000
    /// The global rate window. Default 5 s: the mean stays 200 a second, but a loaded event loop that
    /// stalled and then accepts its backlog at once (a crowd's beacon fetches, spread over seconds) is
    /// not taken for an overload, as it was in a 1 s window (issue 24).
    public var globalWindow: Duration = .seconds(5)
    /// How long the port stays closed after a global overload. Default 30 s.
    public var overloadClosePeriod: Duration = .seconds(30)
    /// Connections admitted from all sources per ``globalWindow`` past which the port is *busy*: a beacon
    /// request is then answered with a cheap `503` and `Retry-After` (``AdmissionController/retryAfterIfBusy(now:)``)
    /// instead of its stream, so that a crowd slows down long before ``maxConnectionsGlobal`` closes the
    /// port. Default 500, half the overload rate. At or above ``maxConnectionsGlobal``: never busy by rate.
    public var busyConnectionsGlobal: Int = 500
    /// Unauthenticated connections open at once (the asking one included) past which the port is busy, so
    /// that beacon requests back off before ``maxUnauthenticatedGlobal`` refuses connections outright.
    /// Default 24, three quarters of ``maxUnauthenticatedGlobal``.
    public var busyUnauthenticatedGlobal: Int = 24
    /// Busy answers per ``globalWindow`` that give their connection's place in the global rate back: a
    /// busy answer is itself the cheap refusal (an accept and a hundred bytes), so a crowd that is told
    /// "later" does not also close the port (issue 24: a crowd of 500 did, once, at 1,000 per 5 s). Past
    /// this many, busy answers count like any connection, so a flood of requests still reaches the last
    /// resort, at ``maxConnectionsGlobal`` plus this many per window. Default 1,000.
    public var maxBusyAnswersGlobal: Int = 1000
    /// The longest wait a busy answer names: each draws a whole number of seconds from 1 to this, so the
    /// crowd it turns away does not come back in one wave. Default 5 s, the global window.
    public var maxBusyRetryAfter: Duration = .seconds(5)
    /// Sources in their refusal period (see ``sourceRefusalPeriod``) that a listener refuses in the
    /// kernel as well, the latest refusals first (``ListenerSourceFilter``: a socket filter drops their
    /// segments before a connection exists, so a refused source costs no accept and no close); the
    /// others are refused after their accept, as before. 0: no kernel filter. At most
    /// ``SourceFilterProgram/maximumSources``. Default 64.
    public var maxFilteredSources: Int = 64
    /// Sources whose counts are remembered (bounds the gate's memory). When full, sources with nothing
    /// open and the oldest windows are forgotten first. At least ``maxOpenGlobal``. Default 4,096.
    public var maxTrackedSources: Int = 4096

    /// The defaults above.
    public init() {}

    /// Why these limits cannot work, or nil when they can.
    public var problem: String? {
        let positive: [(String, Int)] = [
            ("maxConnectionsPerSource", maxConnectionsPerSource), ("maxUnauthenticatedPerSource", maxUnauthenticatedPerSource),
            ("maxOpenPerSource", maxOpenPerSource), ("maxUnauthenticatedGlobal", maxUnauthenticatedGlobal),
            ("maxOpenGlobal", maxOpenGlobal), ("maxConnectionsGlobal", maxConnectionsGlobal),
            ("maxTrackedSources", maxTrackedSources), ("busyConnectionsGlobal", busyConnectionsGlobal),
            ("busyUnauthenticatedGlobal", busyUnauthenticatedGlobal), ("maxBusyAnswersGlobal", maxBusyAnswersGlobal),
        ]
        if let (name, _) = positive.first(where: { $0.1 < 1 }) { return "\(name) must be at least 1" }
        if sourceWindow <= .zero { return "sourceWindow must be positive" }
        if globalWindow <= .zero { return "globalWindow must be positive" }
        if sourceRefusalPeriod < .zero { return "sourceRefusalPeriod must not be negative" }
        if overloadClosePeriod < .zero { return "overloadClosePeriod must not be negative" }
        if maxBusyRetryAfter < .seconds(1) { return "maxBusyRetryAfter must be at least 1 s" }
        if maxFilteredSources < 0 { return "maxFilteredSources must not be negative" }
        if maxFilteredSources > SourceFilterProgram.maximumSources {
            return "maxFilteredSources must be at most \(SourceFilterProgram.maximumSources)"
        }
        if maxTrackedSources < maxOpenGlobal { return "maxTrackedSources must be at least maxOpenGlobal" }
        return nil
    }
}

/// What an ``AdmissionGate`` has done.
public struct AdmissionCounters: Sendable, Hashable, Codable {
    /// Connections admitted.
    public var admitted = 0
    /// Admitted connections that authenticated.
    public var authenticated = 0
    /// Refused because their source exceeded its rate (and then, during its refusal period).
    public var refusedSourceRate = 0
    /// Refused because their source held ``AdmissionLimits/maxUnauthenticatedPerSource`` already.
    public var refusedSourceUnauthenticated = 0
    /// Refused because their source held ``AdmissionLimits/maxOpenPerSource`` already.
    public var refusedSourceOpen = 0
    /// Refused because ``AdmissionLimits/maxUnauthenticatedGlobal`` were open.
    public var refusedGlobalUnauthenticated = 0
    /// Refused because ``AdmissionLimits/maxOpenGlobal`` were open.
    public var refusedGlobalOpen = 0
    /// Refused because the port was closed for an overload (or started one).
    public var refusedOverload = 0
    /// Times the global rate was exceeded and the port closed (the last resort).
    public var overloads = 0
    /// Sources that exceeded their rate and were refused for ``AdmissionLimits/sourceRefusalPeriod``.
    public var sourcesRefused = 0
    /// Sources forgotten to make room (their counts started again).
    public var sourcesForgotten = 0
    /// Requests told to come back later because the port was busy (``AdmissionLimits/busyConnectionsGlobal``).
    public var busyAnswers = 0

    /// All zero.
    public init() {}

    /// Every refusal, whatever its reason.
    public var refused: Int {
        refusedSourceRate + refusedSourceUnauthenticated + refusedSourceOpen + refusedGlobalUnauthenticated
            + refusedGlobalOpen + refusedOverload
    }
}
