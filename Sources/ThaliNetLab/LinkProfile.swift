/// What one link of the lab does to the frames that cross it, in each direction on its own: a one-way
/// delay with jitter, random loss (higher for multicast frames, which Wi-Fi sends at a basic rate without
/// link-layer retransmission), a rate with a bounded queue, and, optionally, flaps (the link down for a
/// few seconds now and then) and, applied by ``NetLab`` rather than the wire, a host's address replaced
/// now and then (roaming). Times are in nanoseconds; the named profiles are issue 38's.
public struct LinkProfile: Sendable, Equatable {
    /// The profile's name (`--profile`).
    public var name: String
    /// Bits per second a direction carries (serialisation time per frame); nil: no rate limit.
    public var rateBitsPerSecond: Int?
    /// One-way delay added to every frame, in nanoseconds.
    public var delayNanoseconds: Int64
    /// Each frame's delay is `delay` plus a uniform sample in `-jitter...jitter` (never below zero), in
    /// nanoseconds; frames stay in order per direction, as a real link rarely reorders.
    public var jitterNanoseconds: Int64
    /// Probability that a unicast (or broadcast) frame is lost, 0...1.
    public var loss: Double
    /// Probability that a multicast frame (group bit set, not broadcast) is lost, 0...1.
    public var multicastLoss: Double
    /// When set, the link goes down (every frame dropped) now and then.
    public var flaps: FlapPattern?
    /// When set, one host's address is replaced by another now and then (`ip addr del`, then `add`): a
    /// phone that joined another access point. ``NetLab`` applies it; the wire forwards frames as before.
    public var addressChanges: AddressChangePattern?
    /// The most bytes a direction's transmit queue holds (frames waiting for the rate); a frame that
    /// does not fit is dropped at the tail, as a NIC's queue drops. Only meaningful with a rate.
    public var queueBytes: Int

    /// The default queue bound: 100 full-sized frames (1514 bytes), about what a Wi-Fi access point
    /// queues per station; 30 ms at 40 Mbit/s, 240 ms at 5 Mbit/s.
    public static let defaultQueueBytes = 100 * 1514

    /// A profile; rates in bits per second, times in nanoseconds.
    public init(name: String, rateBitsPerSecond: Int? = nil, delayNanoseconds: Int64 = 0, jitterNanoseconds: Int64 = 0,
                loss: Double = 0, multicastLoss: Double = 0, flaps: FlapPattern? = nil, addressChanges: AddressChangePattern? = nil,
                queueBytes: Int = defaultQueueBytes) {
        self.name = name
        self.rateBitsPerSecond = rateBitsPerSecond
        self.delayNanoseconds = delayNanoseconds
        self.jitterNanoseconds = jitterNanoseconds
        self.loss = loss
        self.multicastLoss = multicastLoss
        self.flaps = flaps
        self.addressChanges = addressChanges
        self.queueBytes = queueBytes
    }

    /// True when the profile changes nothing: frames are forwarded as they come, and addresses stay.
    public var isUnshaped: Bool {
        rateBitsPerSecond == nil && delayNanoseconds == 0 && jitterNanoseconds == 0 && loss == 0 && multicastLoss == 0
            && flaps == nil && addressChanges == nil
    }

    /// Nothing added: the stage measured against itself.
    public static let unshaped = LinkProfile(name: "unshaped")
    /// A home access point: 40 Mbit/s, 4 ms one way, 1 ms jitter, 0.5 % loss, 5 % multicast loss.
    public static let homeWifi = LinkProfile(name: "home-wifi", rateBitsPerSecond: 40_000_000, delayNanoseconds: 4_000_000,
                                             jitterNanoseconds: 1_000_000, loss: 0.005, multicastLoss: 0.05)
    /// A crowded hall: 10 Mbit/s, 20 ms one way, 10 ms jitter, 2 % loss, 30 % multicast loss.
    public static let crowdedHall = LinkProfile(name: "crowded-hall", rateBitsPerSecond: 10_000_000, delayNanoseconds: 20_000_000,
                                                jitterNanoseconds: 10_000_000, loss: 0.02, multicastLoss: 0.30)
    /// The far edge of coverage: 5 Mbit/s, 60 ms one way, 20 ms jitter, 3 % loss, 50 % multicast loss.
    public static let farLink = LinkProfile(name: "far-link", rateBitsPerSecond: 5_000_000, delayNanoseconds: 60_000_000,
                                            jitterNanoseconds: 20_000_000, loss: 0.03, multicastLoss: 0.50)
    /// `home-wifi` with the link down for 2-8 s at random every 10-30 s.
    public static let flapping: LinkProfile = {
        var profile = homeWifi
        profile.name = "flapping"
        profile.flaps = FlapPattern(downNanoseconds: 2_000_000_000...8_000_000_000, upNanoseconds: 10_000_000_000...30_000_000_000)
        return profile
    }()

    /// `home-wifi` with the first host's address replaced by another every 30 s (``AddressChangePattern``).
    public static let roaming: LinkProfile = {
        var profile = homeWifi
        profile.name = "roaming"
        profile.addressChanges = AddressChangePattern(periodNanoseconds: 30_000_000_000, host: 0)
        return profile
    }()

    /// Every named profile, in the order `--help` lists them.
    public static let named: [LinkProfile] = [unshaped, homeWifi, crowdedHall, farLink, flapping, roaming]

    /// The named profile called `name`, if any.
    public static func named(_ name: String) -> LinkProfile? { named.first { $0.name == name } }
}

/// How a flapping link goes down: up for a uniform random time in `upNanoseconds`, then down for a uniform
/// random time in `downNanoseconds`, and again.
public struct FlapPattern: Sendable, Equatable {
    /// How long each outage lasts, in nanoseconds.
    public var downNanoseconds: ClosedRange<Int64>
    /// How long the link stays up between two outages, in nanoseconds.
    public var upNanoseconds: ClosedRange<Int64>

    /// A pattern; both ranges in nanoseconds.
    public init(downNanoseconds: ClosedRange<Int64>, upNanoseconds: ClosedRange<Int64>) {
        self.downNanoseconds = downNanoseconds
        self.upNanoseconds = upNanoseconds
    }
}

/// How a host of the lab roams: every `periodNanoseconds` from the lab's start, host `host`'s address is
/// removed and another added in its place (``NetLab/address(ofHost:afterChanges:)`` says which).
public struct AddressChangePattern: Sendable, Equatable {
    /// How long each address holds, in nanoseconds.
    public var periodNanoseconds: Int64
    /// The host (0-based) whose address changes.
    public var host: Int

    /// The shortest period a lab accepts: an address change takes a few `ip` commands.
    public static let minimumPeriodNanoseconds: Int64 = 500_000_000

    /// A pattern; the period in nanoseconds.
    public init(periodNanoseconds: Int64, host: Int = 0) {
        self.periodNanoseconds = periodNanoseconds
        self.host = host
    }
}
