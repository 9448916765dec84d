import NIOCore
import Testing
@testable import ThaliAdmission

/// The busy port (`spec/ssdp.md` 6.1): past its busy budget it asks beacon requesters to come back later,
/// and those cheap answers give their places in the global rate back, up to a bound, so that a crowd it
/// turned away does not also close the port; a flood of requests answered busy still reaches the last resort.
@Suite("AdmissionGate: busy answers")
struct BusyGateTests {
    private let now = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    private var limits: AdmissionLimits {
        var limits = AdmissionLimits()
        limits.maxConnectionsGlobal = 4
        limits.busyConnectionsGlobal = 2
        limits.maxBusyAnswersGlobal = 3
        limits.globalWindow = .seconds(10)
        limits.maxUnauthenticatedGlobal = 100
        limits.busyUnauthenticatedGlobal = 100
        limits.maxOpenGlobal = 100
        return limits
    }

    @Test("busy past its budget; busy answers give their places back up to their bound, then the last resort holds")
    func busyAnswersDoNotCloseThePort() {
        var gate = AdmissionGate<String>(limits: limits)
        for index in 0..<2 {
            #expect(gate.admit("s\(index)", now: now) == .admitted)
            #expect(!gate.isBusy(at: now), "within the busy budget")
        }
        // Busy from here on: each busy answer gives its connection's place back, three times.
        for index in 2..<5 {
            #expect(gate.admit("s\(index)", now: now) == .admitted, "connection \(index)")
            #expect(gate.isBusy(at: now))
            gate.answeredBusy(at: now)
        }
        #expect(gate.counters.overloads == 0)
        // Their bound spent, busy answers count like any connection, and the last resort is still there.
        #expect(gate.admit("s5", now: now) == .admitted)
        gate.answeredBusy(at: now)
        #expect(gate.admit("s6", now: now) == .admitted)
        #expect(gate.admit("s7", now: now) == .refused(.overloaded))
        #expect(gate.counters.busyAnswers == 4)
    }

    @Test("busy by unauthenticated connections open, the asking one included; not busy once they close")
    func busyByOpenConnections() {
        var limits = self.limits
        limits.busyUnauthenticatedGlobal = 2
        limits.maxConnectionsGlobal = 100
        limits.busyConnectionsGlobal = 100
        var gate = AdmissionGate<String>(limits: limits)
        for index in 0..<3 { #expect(gate.admit("s\(index)", now: now) == .admitted) }
        #expect(gate.isBusy(at: now))
        gate.closed("s0", authenticated: false)
        #expect(!gate.isBusy(at: now))
    }

    @Test("the controller names a Retry-After within 1...maxBusyRetryAfter seconds only while busy")
    func controllerRetryAfter() {
        var limits = self.limits
        limits.maxBusyRetryAfter = .seconds(3)
        let controller = AdmissionController<String>(limits: limits)
        var tickets: [AdmissionTicket<String>] = []
        for index in 0..<2 {
            if case .success(let ticket) = controller.admit("s\(index)", now: now) { tickets.append(ticket) }
            #expect(controller.retryAfterIfBusy(now: now) == nil)
        }
        if case .success(let ticket) = controller.admit("s2", now: now) { tickets.append(ticket) }
        let seconds = controller.retryAfterIfBusy(now: now)
        #expect(seconds.map { (1...3).contains($0) } == true, "\(String(describing: seconds))")
        #expect(controller.counters.busyAnswers == 1)
        #expect(tickets.count == 3)
    }
}
