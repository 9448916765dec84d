import NIOCore

/// Beacon fetches waiting for a slot: at most ``SSDPDiscoveryLimits/maxConcurrentFetches`` in flight,
/// the queue no longer than ``SSDPDiscoveryLimits/maxTrackedPeers`` (a contact's fetch always fits, at its
/// front), and the locations whose fetch waits out its crowd spread (one wait per location, however
/// many USNs it announces meanwhile). A pure value.
struct SSDPFetchQueue {
    let maxQueued: Int
    let maxInFlight: Int
    private var queue: [(location: BeaconLocation, serviceName: String)] = []
    /// Locations whose fetch waits out its spread (``SSDPDiscoveryLimits/fetchDelay(trackedPeers:using:)``).
    private(set) var spreading: Set<BeaconLocation> = []
    /// Fetches started and not finished.
    private(set) var inFlight = 0

    init(limits: SSDPDiscoveryLimits) {
        maxQueued = limits.maxTrackedPeers
        maxInFlight = limits.maxConcurrentFetches
    }

    /// Fetches queued now.
    var count: Int { queue.count }

    /// Queues a fetch of `serviceName`, a contact's ahead of strangers'; false when the queue is full.
    mutating func enqueue(_ location: BeaconLocation, serviceName: String, contact: Bool) -> Bool {
        guard queue.count < maxQueued || contact else { return false }
        if contact { queue.insert((location, serviceName), at: 0) } else { queue.append((location, serviceName)) }
        return true
    }

    /// The next queued fetch, if a slot is free; call `started()` if it is made.
    mutating func next() -> (location: BeaconLocation, serviceName: String)? {
        guard inFlight < maxInFlight, !queue.isEmpty else { return nil }
        return queue.removeFirst()
    }

    /// A fetch took a slot.
    mutating func started() { inFlight += 1 }

    /// A fetch gave its slot back.
    mutating func finished() { inFlight = max(0, inFlight - 1) }

    /// `location`'s fetch starts waiting out its spread; false when it waits already.
    mutating func beginSpread(of location: BeaconLocation) -> Bool { spreading.insert(location).inserted }

    /// `location`'s wait ended.
    mutating func endSpread(of location: BeaconLocation) { spreading.remove(location) }
}
