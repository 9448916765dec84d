import NIOConcurrencyHelpers
import NIOCore
import Testing
@testable import ThaliAdmission

/// The gate as a pure value: every bound exercised with a clock the test moves.
@Suite("AdmissionGate")
struct AdmissionGateTests {
    private let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    private func limits(_ change: (inout AdmissionLimits) -> Void = { _ in }) -> AdmissionLimits {
        var limits = AdmissionLimits()
        change(&limits)
        return limits
    }

    @Test("a source over its rate is refused for its refusal period and costs the global budget nothing")
    func perSourceRateBeforeGlobal() {
        var gate = AdmissionGate<String>(limits: limits {
            $0.maxConnectionsPerSource = 5
            $0.maxConnectionsGlobal = 10
            $0.sourceRefusalPeriod = .seconds(60)
            $0.maxUnauthenticatedPerSource = 100
            $0.maxOpenPerSource = 100
        })
        var now = start
        for _ in 0..<5 {
            #expect(gate.admit("attacker", now: now) == .admitted)
            gate.closed("attacker", authenticated: false)
        }
        // 1000 more attempts within the same second: each refused for the source alone.
        for _ in 0..<1000 { #expect(gate.admit("attacker", now: now) == .refused(.sourceRate)) }
        #expect(gate.closedUntil == nil, "no global overload from one source")
        // Honest sources still get in: 5 of the 10 global slots this second are left.
        for index in 0..<5 { #expect(gate.admit("honest-\(index)", now: now) == .admitted) }
        #expect(gate.counters.overloads == 0)
        #expect(gate.counters.sourcesRefused == 1)
        // Still refused 59 s later, admitted again after 60 s.
        now = start + .seconds(59)
        #expect(gate.admit("attacker", now: now) == .refused(.sourceRate))
        now = start + .seconds(61)
        #expect(gate.admit("attacker", now: now) == .admitted)
    }

    @Test("unauthenticated connections are bounded per source, then globally; authenticating frees the slot")
    func unauthenticatedSlots() {
        var gate = AdmissionGate<String>(limits: limits {
            $0.maxUnauthenticatedPerSource = 2
            $0.maxUnauthenticatedGlobal = 3
        })
        #expect(gate.admit("a", now: start) == .admitted)
        #expect(gate.admit("a", now: start) == .admitted)
        #expect(gate.admit("a", now: start) == .refused(.sourceUnauthenticated))
        #expect(gate.admit("b", now: start) == .admitted)
        #expect(gate.admit("c", now: start) == .refused(.globalUnauthenticated))
        // One of a's handshakes succeeds: a and c may each start another.
        gate.authenticated("a")
        #expect(gate.unauthenticated == 2)
        #expect(gate.admit("c", now: start) == .admitted)
        #expect(gate.openConnections(of: "a") == (open: 2, unauthenticated: 1))
        gate.closed("a", authenticated: true)
        gate.closed("a", authenticated: false)
        #expect(gate.openConnections(of: "a") == (open: 0, unauthenticated: 0))
        #expect(gate.open == 2)
    }

    @Test("open connections are bounded per source and globally")
    func openSlots() {
        var gate = AdmissionGate<String>(limits: limits {
            $0.maxOpenPerSource = 2
            $0.maxOpenGlobal = 3
        })
        for _ in 0..<2 {
            #expect(gate.admit("a", now: start) == .admitted)
            gate.authenticated("a")
        }
        #expect(gate.admit("a", now: start) == .refused(.sourceOpen))
        #expect(gate.admit("b", now: start) == .admitted)
        #expect(gate.admit("c", now: start) == .refused(.globalOpen))
    }

    @Test("the global rate closes the port only as the last resort, for the overload period")
    func globalOverloadIsTheLastResort() {
        var gate = AdmissionGate<String>(limits: limits {
            $0.maxConnectionsGlobal = 10
            $0.overloadClosePeriod = .seconds(30)
        })
        // Ten different sources, each within its own bounds, fill the global second...
        for index in 0..<10 {
            #expect(gate.admit("s\(index)", now: start) == .admitted)
            gate.closed("s\(index)", authenticated: false)
        }
        // ...and the eleventh closes the port.
        #expect(gate.admit("s10", now: start) == .refused(.overloaded))
        #expect(gate.isClosedForOverload(now: start + .seconds(29)))
        #expect(gate.admit("s11", now: start + .seconds(29)) == .refused(.closedForOverload))
        #expect(gate.admit("s11", now: start + .seconds(31)) == .admitted)
        #expect(gate.counters.overloads == 1)
    }

    @Test("the source table stays within maxTrackedSources and never forgets a source with open connections")
    func trackedSourcesAreBounded() {
        var gate = AdmissionGate<Int>(limits: limits {
            $0.maxTrackedSources = 200
            $0.maxOpenGlobal = 128
            $0.maxUnauthenticatedGlobal = 128
            $0.maxConnectionsGlobal = 100_000
        })
        #expect(gate.admit(-1, now: start) == .admitted)  // stays open
        for source in 0..<10_000 {
            #expect(gate.admit(source, now: start + .milliseconds(Int64(source))) == .admitted)
            gate.closed(source, authenticated: false)
        }
        #expect(gate.trackedSources <= 200)
        #expect(gate.openConnections(of: -1).open == 1)
        #expect(gate.counters.sourcesForgotten > 0)
    }

    @Test("limits that cannot work are named")
    func problems() {
        #expect(AdmissionLimits().problem == nil)
        #expect(limits { $0.maxOpenPerSource = 0 }.problem == "maxOpenPerSource must be at least 1")
        #expect(limits { $0.sourceWindow = .zero }.problem == "sourceWindow must be positive")
        #expect(limits { $0.maxTrackedSources = 10 }.problem == "maxTrackedSources must be at least maxOpenGlobal")
    }

    @Test("a ticket gives its slots back once, however often it is released")
    func ticketsReleaseOnce() {
        let controller = AdmissionController<String>(limits: limits { $0.maxUnauthenticatedPerSource = 1 })
        guard case .success(let ticket) = controller.admit("a") else {
            Issue.record("not admitted")
            return
        }
        #expect(controller.admit("a") == .failure(.sourceUnauthenticated))
        ticket.authenticated()
        ticket.authenticated()
        #expect(controller.unauthenticatedConnections == 0)
        ticket.release()
        ticket.release()
        #expect(controller.openConnections == 0)
        #expect(controller.unauthenticatedConnections == 0)
    }

    @Test("the controller reports an overload with the close period")
    func controllerReportsOverload() {
        let reported = NIOLockedValueBox<Duration?>(nil)
        let controller = AdmissionController<String>(limits: limits { $0.maxConnectionsGlobal = 1 }) { period in
            reported.withLockedValue { $0 = period }
        }
        let now = NIODeadline.now()
        if case .success(let ticket) = controller.admit("a", now: now) { ticket.release() }
        #expect(controller.admit("b", now: now) == .failure(.overloaded))
        #expect(reported.withLockedValue { $0 } == .seconds(30))
    }
}

extension Result where Success == AdmissionTicket<String>, Failure == AdmissionRefusal {
    static func == (lhs: Self, rhs: Self) -> Bool {
        switch (lhs, rhs) {
        case (.failure(let a), .failure(let b)): a == b
        default: false
        }
    }
}

