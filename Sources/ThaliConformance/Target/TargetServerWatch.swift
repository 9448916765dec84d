import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP

/// Reads a ``PeerSuiteServer``'s events for target mode: counts fetches and connection attempts over a
/// period, or waits for a session (and plays the sender on it: hello, welcome, done).
struct ServerWatch {
    /// What the implementation did in one period.
    struct Seen: CustomStringConvertible {
        var fetches = 0
        /// PSK-TLS handshakes, authenticated or failed.
        var connections = 0
        /// Authenticated sessions that agreed on `thali-streams/1`.
        var markedSessions = 0
        var session = false
        /// Whether a delivery session answered our hello with its welcome.
        var welcomed: Bool { welcome == nil }
        /// What came instead of the welcome to our hello (nil: the welcome came, or no stream yet).
        var welcome: String? = "no delivery stream"
        /// The headers of the marked streams it opened, with our answers.
        var headers: [(MarkedStreamAcceptor.Header, StreamStatus)] = []
        /// Marked streams we refused that it closed.
        var refusedEnded = 0
        /// How its authenticated sessions ended, in order.
        var ended: [SessionEnd] = []
        var refused: Int { headers.count { if case .refused = $0.1 { true } else { false } } }
        var description: String {
            "\(fetches) fetch(es), \(connections) connection(s)" + (markedSessions > 0 ? " (\(markedSessions) marked)" : "")
                + (session ? ", a session" : "") + (refused > 0 ? ", \(refused) stream(s) refused, \(refusedEnded) closed by it" : "")
        }
    }

    let server: PeerSuiteServer
    private var events: AsyncStream<PeerSuiteServer.Event>.AsyncIterator
    private var wakes = 0

    init(server: PeerSuiteServer) {
        self.server = server
        events = server.events.makeAsyncIterator()
    }

    /// Everything that happens in `period` (a connection here is what a negative case looks for, so the
    /// whole period is watched).
    mutating func observe(for period: TimeAmount) async throws -> Seen {
        try await watch(period) { _ in false }
    }

    /// Waits until a session is authenticated and its delivery stream ends, or `timeout` passes.
    mutating func untilSession(within timeout: TimeAmount) async throws -> Seen {
        try await watch(timeout) { $0.session }
    }

    /// Waits until an authenticated session's connection closes, or `timeout` passes.
    mutating func untilSessionEnds(within timeout: TimeAmount) async throws -> Seen {
        try await watch(timeout) { !$0.ended.isEmpty }
    }

    private mutating func watch(_ period: TimeAmount, until done: (Seen) -> Bool) async throws -> Seen {
        wakes += 1
        let wake = wakes
        server.wake(after: period, id: wake)
        var seen = Seen()
        while let event = await events.next() {
            switch event {
            case .beaconsFetched: seen.fetches += 1
            case .authenticated(let marked):
                seen.connections += 1
                if marked { seen.markedSessions += 1 }
            case .handshakeFailed: seen.connections += 1
            case .markedStream(let header, let status):
                seen.headers.append((header, status))
            case .refusedStreamEnded:
                seen.refusedEnded += 1
            case .sessionEnded(let end):
                seen.ended.append(end)
            case .stream(let frames):
                seen.welcome = await Self.finishSession(frames)
                seen.session = true
            case .wake(let id) where id == wake: return seen
            case .wake: break
            }
            if done(seen) { return seen }
        }
        return seen
    }

    /// Plays a sender with nothing to send: hello, its welcome, done, then the end of the stream. Returns
    /// nil when the welcome came, else what came instead.
    static func finishSession(_ frames: DeliveryChannel.AsyncFrames) async -> String? {
        var instead: String? = "the stream ended"
        do {
            try await frames.executeThenClose { inbound, outbound in
                var iterator = inbound.makeAsyncIterator()
                try await outbound.write(.hello(version: DeliveryFrame.protocolVersion))
                let first = try await iterator.next()
                guard case .welcome? = first else {
                    instead = first.map { "a \($0.name) frame" } ?? "the stream ended"
                    return
                }
                instead = nil
                try await outbound.write(.done)
                while try await iterator.next() != nil {}
            }
        } catch {
            if instead != nil { instead = "the stream failed: \(error)" }
        }
        return instead
    }
}
