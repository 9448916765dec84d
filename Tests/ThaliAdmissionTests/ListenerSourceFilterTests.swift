import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import ThaliTestSupport
@testable import ThaliAdmission

/// The kernel filter on a real listening socket (Linux, loopback): a source the gate refused for its rate
/// gets no connection at all (its connect times out; the listener accepts nothing from it), every other
/// source connects, and the refused source connects again when its refusal period ends.
@Suite("ListenerSourceFilter", .serialized)
struct ListenerSourceFilterTests {
    /// A listener admitting through `admission` (refused connections are closed at once, as the suite's
    /// servers do), with its kernel filter; every accepted connection's source is recorded.
    private final class Listener: Sendable {
        let channel: any Channel
        let filter: ListenerSourceFilter?
        let accepted: NIOLockedValueBox<[String]>
        let updates: AsyncStream<[String]>

        init(host: String, admission: AdmissionController<String>) async throws {
            let accepted = NIOLockedValueBox<[String]>([])
            self.accepted = accepted
            channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    let source = channel.remoteAddress?.ipAddress ?? "?"
                    accepted.withLockedValue { $0.append(source) }
                    guard case .success(let ticket) = admission.admit(source) else { return channel.close() }
                    ticket.release(when: channel.closeFuture)
                    return channel.eventLoop.makeSucceededVoidFuture()
                }
                .bind(host: host, port: 0).get()
            let (stream, continuation) = AsyncStream<[String]>.makeStream()
            updates = stream
            filter = ListenerSourceFilter.attach(to: channel, admission: admission) { continuation.yield($0) }
        }

        var port: Int { channel.localAddress?.port ?? 0 }

        func acceptedCount(from source: String) -> Int {
            accepted.withLockedValue { $0.filter { $0.hasSuffix(source) }.count }
        }

        /// Waits (at most 5 s) until `count` connections from `source` were accepted, and says whether
        /// they were; a connect completes in the client before the listener has run its accept.
        func waitForAccepted(_ count: Int, from source: String) async throws -> Bool {
            _ = try await waitUntil(timeout: .seconds(5), every: .milliseconds(5)) { acceptedCount(from: source) >= count }
            return acceptedCount(from: source) == count
        }

        /// Waits for the next list of filtered sources the kernel has.
        func nextUpdate() async -> [String]? {
            var iterator = updates.makeAsyncIterator()
            return await iterator.next()
        }
    }

    private func limits(refusalPeriod: Duration) -> AdmissionLimits {
        var limits = AdmissionLimits()
        limits.maxConnectionsPerSource = 3
        limits.sourceRefusalPeriod = refusalPeriod
        return limits
    }

    /// Makes `source` exceed its rate at `listener` with `connections` more (the last is refused after
    /// its accept) and waits until the kernel filters it.
    private func refuse(_ source: String, at listener: Listener, host: String, connections: Int = 4) async throws {
        for _ in 0..<connections { #expect(await connect(from: source, to: host, port: listener.port) == .connected) }
        let update = await listener.nextUpdate()
        #expect(update?.contains { $0.hasSuffix(source) } == true)
    }

    @Test("IPv4: a refused source's connects time out without an accept; others connect; it is let in when its refusal ends")
    func ipv4() async throws {
        let admission = AdmissionController<String>(limits: limits(refusalPeriod: .seconds(2)))
        let listener = try await Listener(host: "127.0.0.1", admission: admission)
        defer { listener.channel.close(promise: nil) }
        #expect(listener.filter != nil)
        try await refuse("127.0.0.2", at: listener, host: "127.0.0.1")
        let acceptedBefore = listener.acceptedCount(from: "127.0.0.2")

        for _ in 0..<3 { #expect(await connect(from: "127.0.0.2", to: "127.0.0.1", port: listener.port) == .timedOut) }
        #expect(listener.acceptedCount(from: "127.0.0.2") == acceptedBefore, "nothing accepted from the refused source")
        #expect(await connect(from: "127.0.0.3", to: "127.0.0.1", port: listener.port) == .connected)
        #expect(try await listener.waitForAccepted(1, from: "127.0.0.3"))

        // The refusal period ends: the filter lets the source in again (a timer, no connection needed).
        #expect(await listener.nextUpdate() == [])
        #expect(await connect(from: "127.0.0.2", to: "127.0.0.1", port: listener.port) == .connected)
        #expect(try await listener.waitForAccepted(acceptedBefore + 1, from: "127.0.0.2"))
        #expect(listener.filter?.counters == ListenerSourceFilter.Counters(updates: 2, failures: 0))
    }

    @Test("a dual-stack listener: an IPv4 source (IPv4-mapped) and an IPv6 source are each refused alone")
    func dualStack() async throws {
        let admission = AdmissionController<String>(limits: limits(refusalPeriod: .seconds(30)))
        let listener = try await Listener(host: "::", admission: admission)
        defer { listener.channel.close(promise: nil) }
        try await refuse("127.0.0.4", at: listener, host: "127.0.0.1")
        #expect(listener.filter?.filteredSources == ["::ffff:127.0.0.4"])
        #expect(await connect(from: "127.0.0.4", to: "127.0.0.1", port: listener.port) == .timedOut)
        #expect(await connect(from: "::1", to: "::1", port: listener.port) == .connected)

        try await refuse("::1", at: listener, host: "::1", connections: 3)  // one admitted already
        #expect(listener.filter?.filteredSources == ["::1", "::ffff:127.0.0.4"])
        let acceptedBefore = listener.acceptedCount(from: "::1")
        #expect(await connect(from: "::1", to: "::1", port: listener.port) == .timedOut)
        #expect(listener.acceptedCount(from: "::1") == acceptedBefore)
        #expect(await connect(from: "127.0.0.5", to: "127.0.0.1", port: listener.port) == .connected)
    }

    @Test("a listener bound while sources are refused (a port reopened) filters them from the start, at most maxFilteredSources")
    func refusedBeforeBinding() async throws {
        var limits = limits(refusalPeriod: .seconds(30))
        limits.maxFilteredSources = 2
        let admission = AdmissionController<String>(limits: limits)
        let now = NIODeadline.now()
        for (index, source) in ["127.0.0.7", "127.0.0.8", "127.0.0.9"].enumerated() {
            for _ in 0..<4 { _ = admission.admit(source, now: now + .milliseconds(Int64(index))) }
        }
        #expect(admission.refusedSources().count == 3)
        let listener = try await Listener(host: "127.0.0.1", admission: admission)
        defer { listener.channel.close(promise: nil) }
        // The latest two refusals.
        #expect(await listener.nextUpdate() == ["127.0.0.8", "127.0.0.9"])
        #expect(await connect(from: "127.0.0.9", to: "127.0.0.1", port: listener.port) == .timedOut)
        // The third is refused after its accept, as without a filter.
        #expect(await connect(from: "127.0.0.7", to: "127.0.0.1", port: listener.port) == .connected)
        #expect(try await listener.waitForAccepted(1, from: "127.0.0.7"))
        #expect(listener.acceptedCount(from: "127.0.0.9") == 0)
    }

    @Test("no kernel filter when maxFilteredSources is 0: the gate alone refuses, after the accept")
    func disabled() async throws {
        var limits = limits(refusalPeriod: .seconds(30))
        limits.maxFilteredSources = 0
        let admission = AdmissionController<String>(limits: limits)
        let listener = try await Listener(host: "127.0.0.1", admission: admission)
        defer { listener.channel.close(promise: nil) }
        #expect(listener.filter == nil)
        for _ in 0..<5 { #expect(await connect(from: "127.0.0.6", to: "127.0.0.1", port: listener.port) == .connected) }
        #expect(try await listener.waitForAccepted(5, from: "127.0.0.6"))
        #expect(admission.counters.refusedSourceRate == 2)
    }
}
