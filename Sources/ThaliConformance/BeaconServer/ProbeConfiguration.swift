import NIOCore
import ThaliBeacons
import ThaliSSDP

/// Every bound and option of a conformance probe. The defaults reuse the suite's own client bounds
/// (`BeaconHTTPClientConfiguration`) and beacon limits (`BeaconLimits`), so the probe judges another
/// implementation by what this one would accept.
public struct ProbeConfiguration: Sendable {
    /// Longest wait for a TCP connection.
    public var connectTimeout: Duration
    /// Longest wait from sending a request to the end of its response.
    public var responseTimeout: Duration
    /// Largest body accepted (ThaliSSDP's client bound by default). The probe reads at most this many
    /// body bytes plus one, then closes the connection, so a hostile server cannot make it buffer more.
    public var maxBodyBytes: Int
    /// Largest response head (status line and headers) read before the connection is cut.
    public var maxHeadBytes: Int
    /// Most beacons a body may carry (`BeaconLimits.maximumBeaconsPerAnnouncement` by default): this
    /// suite's receivers reject longer announcements as malformed.
    public var maxBeacons: Int
    /// Clock skew forgiven when judging the expiration, in milliseconds.
    public var clockSkewToleranceMilliseconds: UInt64 = 0

    /// Whether to run the burst and recovery checks. Off by default: the burst trips the target's
    /// throttling, which may refuse every connection from this address for a minute (other peers on the
    /// address included), so it runs only when asked for and is announced before it starts.
    public var burstEnabled = false
    /// Requests the burst sends, one connection each. At most `ProbeConfiguration.maximumBurstRequests`.
    public var burstRequests = 200
    /// Requests the burst keeps in flight at once. At most `ProbeConfiguration.maximumBurstConcurrency`.
    public var burstConcurrency = 16
    /// Longest the burst may run; requests not started by then are not sent.
    public var burstTimeLimit: Duration = .seconds(20)
    /// After the burst, how long the server may stay silent (a port closed for overload counts) before
    /// the probe warns that it stopped answering.
    public var maxOutage: Duration = .seconds(60)
    /// Interval between attempts while waiting for the server to answer again after the burst.
    public var recoveryPollInterval: Duration = .milliseconds(250)
    /// The longest `Retry-After` a busy answer (`503`) of the burst may name (ThaliSSDP's client bound,
    /// 60 s, by default): a client cuts a longer wait to its bound, so a server's own maximum must lie
    /// within it (spec/ssdp.md §6.1). Whole seconds, at least 1 s.
    public var maxBusyRetryAfter: Duration

    /// Upper bound on `burstRequests`: the probe is a checker, not a load generator.
    public static let maximumBurstRequests = 10_000
    /// Upper bound on `burstConcurrency`.
    public static let maximumBurstConcurrency = 256

    /// Defaults taken from `BeaconHTTPClientConfiguration()` and `BeaconLimits()`.
    public init() {
        let client = BeaconHTTPClientConfiguration()
        connectTimeout = client.connectTimeout
        responseTimeout = client.responseTimeout
        maxBodyBytes = client.maxBodyBytes
        maxBusyRetryAfter = client.maxBusyRetryAfter
        maxHeadBytes = client.maxHeadBytes
        maxBeacons = BeaconLimits().maximumBeaconsPerAnnouncement
    }

    /// Why this configuration cannot run (nil: it can).
    public var problem: String? {
        if connectTimeout <= .zero || responseTimeout <= .zero { return "timeouts must be positive" }
        if maxBodyBytes < 1 || maxHeadBytes < 64 { return "max body must be ≥ 1 byte and max head ≥ 64 bytes" }
        if maxBeacons < 1 { return "max beacons must be ≥ 1" }
        if burstEnabled {
            if !(1...Self.maximumBurstRequests).contains(burstRequests) {
                return "burst requests must be 1 ... \(Self.maximumBurstRequests)"
            }
            if !(1...Self.maximumBurstConcurrency).contains(burstConcurrency) {
                return "burst concurrency must be 1 ... \(Self.maximumBurstConcurrency)"
            }
            if burstTimeLimit <= .zero || maxOutage < .zero || recoveryPollInterval <= .zero {
                return "burst time limit and poll interval must be positive, max outage not negative"
            }
            if maxBusyRetryAfter < .seconds(1) { return "max busy Retry-After must be at least 1 s" }
        }
        return nil
    }
}
