/// One direction of a lab link, sans I/O: given a frame and the time it arrived, decides whether it is
/// dropped (link down, queue full, lost) or when it leaves. Driven by the stage with the monotonic clock
/// and by the tests with a virtual one; times are nanoseconds on whatever clock the caller uses.
///
/// The model, in order: a frame arriving while the link is down is dropped. With a rate, the frame waits
/// for the transmitter (a FIFO queue of at most ``LinkProfile/queueBytes`` bytes, dropping at the tail) and
/// then takes `bytes × 8 / rate` to serialise; the air time is spent even when the frame is then lost. It
/// is lost with the profile's probability (the multicast one for a multicast frame). Otherwise it arrives
/// `delay + jitter sample` after it was serialised, but never before the frame before it: release =
/// max(previous release, departure + delay + jitter), so frames keep their order within a direction.
public struct LinkDirection: Sendable {
    /// The profile this direction applies.
    public let profile: LinkProfile
    /// When the transmitter is free again (the last queued frame is serialised), in nanoseconds.
    private var transmitterFreeAt: Int64 = .min
    /// The release time of the last frame let through, in nanoseconds.
    private var lastRelease: Int64 = .min
    /// What this direction did so far.
    public private(set) var counters = LinkCounters()

    /// A direction applying `profile`, with nothing queued.
    public init(profile: LinkProfile) { self.profile = profile }

    /// The nanoseconds `bytes` take to serialise at the profile's rate (0 without a rate).
    public func serialisationNanoseconds(bytes: Int) -> Int64 {
        guard let rate = profile.rateBitsPerSecond, rate > 0 else { return 0 }
        return Int64((Double(bytes) * 8 * 1e9 / Double(rate)).rounded(.up))
    }

    /// The bytes waiting for the transmitter at `now`.
    public func queuedBytes(at now: Int64) -> Int {
        guard let rate = profile.rateBitsPerSecond, rate > 0, transmitterFreeAt > now else { return 0 }
        return Int((Double(transmitterFreeAt - now) * Double(rate) / 8e9).rounded(.down))
    }

    /// Decides the fate of a frame of `bytes` bytes arriving at `now`; `multicast` selects the multicast
    /// loss, `linkDown` drops it outright.
    public mutating func admit<Random: RandomNumberGenerator>(bytes: Int, multicast: Bool, linkDown: Bool, now: Int64,
                                                             using random: inout Random) -> LinkVerdict {
        counters.offered += 1
        if linkDown { return drop(.linkDown) }
        var departure = now
        if profile.rateBitsPerSecond != nil {
            guard queuedBytes(at: now) + bytes <= profile.queueBytes else { return drop(.queueFull) }
            departure = max(now, transmitterFreeAt) + serialisationNanoseconds(bytes: bytes)
            transmitterFreeAt = departure
        }
        let lossProbability = multicast ? profile.multicastLoss : profile.loss
        if lossProbability > 0, Double.random(in: 0..<1, using: &random) < lossProbability {
            return drop(multicast ? .multicastLoss : .loss)
        }
        var delay = profile.delayNanoseconds
        if profile.jitterNanoseconds > 0 {
            delay = max(0, delay + Int64.random(in: -profile.jitterNanoseconds...profile.jitterNanoseconds, using: &random))
        }
        let release = max(lastRelease, departure + delay)
        lastRelease = release
        counters.passed += 1
        return .deliver(at: release)
    }

    private mutating func drop(_ reason: LinkDrop) -> LinkVerdict {
        counters.dropped[reason, default: 0] += 1
        return .drop(reason)
    }
}

/// What a ``LinkDirection`` decided for one frame.
public enum LinkVerdict: Sendable, Equatable {
    /// The frame leaves the link at this time (nanoseconds, the caller's clock).
    case deliver(at: Int64)
    /// The frame is dropped, for this reason.
    case drop(LinkDrop)
}

/// Why a frame was dropped.
public enum LinkDrop: String, Sendable, Hashable, CaseIterable {
    /// The link was down (a flap).
    case linkDown = "link_down"
    /// The transmit queue was full (tail drop).
    case queueFull = "queue_full"
    /// Random loss of a unicast or broadcast frame.
    case loss
    /// Random loss of a multicast frame.
    case multicastLoss = "multicast_loss"
    /// Frames in flight in one direction reached ``WireStage/maximumFramesInFlight`` (the stage's own
    /// bound, for profiles with a delay and no rate).
    case inFlightLimit = "in_flight_limit"
    /// The TAP device refused the write (the receiving host's backlog was full).
    case writeFailed = "write_failed"
}

/// Counts of what a link (or the whole stage) did with frames.
public struct LinkCounters: Sendable, Equatable {
    /// Frames offered to the link.
    public var offered = 0
    /// Frames it let through.
    public var passed = 0
    /// Frames it dropped, by reason.
    public var dropped: [LinkDrop: Int] = [:]

    /// Nothing counted yet.
    public init() {}

    /// Every frame dropped, whatever the reason.
    public var droppedTotal: Int { dropped.values.reduce(0, +) }

    /// Adds `other`'s counts to these.
    public mutating func add(_ other: LinkCounters) {
        offered += other.offered
        passed += other.passed
        dropped.merge(other.dropped, uniquingKeysWith: +)
    }
}

/// When a flapping link is down, sans I/O: up for a random time in the pattern's up range, then down for
/// a random time in its down range, and again, from a start time. Asked with non-decreasing times.
public struct FlapSchedule: Sendable {
    /// The pattern followed.
    public let pattern: FlapPattern
    /// When the current (or next) outage starts, and when it ends, in nanoseconds.
    public private(set) var outage: Range<Int64>
    /// Outages begun so far (counted when a time inside one is asked about).
    public private(set) var outagesSeen = 0
    private var lastCountedOutageStart: Int64 = .min

    /// A schedule whose first up period starts at `start`.
    public init<Random: RandomNumberGenerator>(pattern: FlapPattern, start: Int64, using random: inout Random) {
        self.pattern = pattern
        let downAt = start + Int64.random(in: pattern.upNanoseconds, using: &random)
        outage = downAt..<(downAt + Int64.random(in: pattern.downNanoseconds, using: &random))
    }

    /// Whether the link is down at `now`.
    public mutating func isDown<Random: RandomNumberGenerator>(at now: Int64, using random: inout Random) -> Bool {
        while now >= outage.upperBound {
            let downAt = outage.upperBound + Int64.random(in: pattern.upNanoseconds, using: &random)
            outage = downAt..<(downAt + Int64.random(in: pattern.downNanoseconds, using: &random))
        }
        guard outage.contains(now) else { return false }
        if lastCountedOutageStart != outage.lowerBound {
            lastCountedOutageStart = outage.lowerBound
            outagesSeen += 1
        }
        return true
    }

    /// When the link next changes state after `now` (the end of the outage, or its start).
    public func nextChange(after now: Int64) -> Int64 {
        now < outage.lowerBound ? outage.lowerBound : outage.upperBound
    }
}
