/// The round trips measured to each host this process talks to, bounded: at most ``capacity`` hosts are
/// remembered, and a new one beyond that replaces the one heard from longest ago. Shared by the
/// connections to those hosts (one beacon fetch learns what the next one may wait).
public final class RoundTripTable: Sendable {
    /// The default bound on remembered hosts: a crowd's worth, about 100 KB at most.
    public static let defaultCapacity = 1024

    /// The most hosts remembered.
    public let capacity: Int
    private struct Entry: Sendable {
        var estimate: RoundTripEstimator
        var touched: UInt64
    }
    private struct State: Sendable {
        var entries: [String: Entry] = [:]
        var clock: UInt64 = 0
    }
    private let state = Locked(State())

    /// A table remembering at most `capacity` hosts (at least 1).
    public init(capacity: Int = RoundTripTable.defaultCapacity) {
        self.capacity = max(1, capacity)
    }

    /// Adds a measured round trip to `host`.
    public func record(_ sample: Duration, for host: String) {
        state.withLock { state in
            state.clock += 1
            if var entry = state.entries[host] {
                entry.estimate.add(sample)
                entry.touched = state.clock
                state.entries[host] = entry
                return
            }
            if state.entries.count >= capacity, let oldest = state.entries.min(by: { $0.value.touched < $1.value.touched })?.key {
                state.entries[oldest] = nil
            }
            state.entries[host] = Entry(estimate: RoundTripEstimator(firstSample: sample), touched: state.clock)
        }
    }

    /// What is known of the round trip to `host`; nil before any sample.
    public func estimate(for host: String) -> RoundTripEstimator? {
        state.withLock { $0.entries[host]?.estimate }
    }

    /// How many hosts are remembered.
    public var count: Int { state.withLock { $0.entries.count } }
}
