import CNetLabTap
import Foundation
import ThaliProcess

#if canImport(Glibc)
import Glibc
#endif

/// A lab of hosts on one shaped segment: each host a network namespace (`tlab-<pid>-<n><letter>`) with
/// loopback and one TAP device named `eth0` holding `10.77.0.<i+1>/24` (an address that exists only inside
/// it) and a multicast route; the TAP devices are opened here, in the caller's namespace, moved into the
/// hosts (the descriptors stay attached) and joined by a ``WireStage`` applying the profile; a profile with
/// ``LinkProfile/addressChanges`` has one host's address replaced on a timer of its own. IPv6 is off in
/// the hosts so that only the traffic under test crosses the wire. ``close()`` (also on deinit) stops the
/// stage and deletes the namespaces; a lab left by a process that died is deleted by the next lab made.
///
/// Needs root, `ip` (iproute2) and `/dev/net/tun`.
public final class NetLab: @unchecked Sendable {
    /// One host of the lab.
    public struct Host: Sendable {
        /// The network namespace (`ip netns`).
        public let namespace: String
        /// The host's IPv4 address on the segment when the lab was built (``NetLab/address(ofHost:)``: now).
        public let address: String
        /// The host's interface on the segment.
        public var interface: String { NetLab.interfaceName }
    }

    /// The hosts' /24 (host `i` is `.i+1`).
    public static let subnet = "10.77.0"
    /// The name of each host's interface on the segment.
    public static let interfaceName = "eth0"
    /// How many hosts a lab may have.
    public static let hostCounts = 2...8
    /// Every lab namespace's name starts with this, then the creating process's id and a dash.
    public static let namePrefix = "tlab-"
    /// The longest an `ip` command of the lab may take.
    public static let commandTimeout: Duration = .seconds(10)
    /// How many distinct addresses a roaming host goes through before it comes back to one it had.
    public static let roamingAddresses = 24

    /// One address change the lab made (roaming).
    public struct AddressChange: Sendable {
        /// The host whose address changed.
        public var host: Int
        /// The address removed.
        public var previous: String
        /// The address added in its place.
        public var address: String
        /// When the new address was added (after the `ip addr add` returned).
        public var at: ContinuousClock.Instant
    }

    /// The hosts, in order.
    public let hosts: [Host]
    /// The profile the wire applies.
    public let profile: LinkProfile
    private let stage: WireStage
    private let taps: [Int32]
    private let lock = NSLock()
    private var closed = false
    private var changes: [AddressChange] = []
    private var changeFailures: [String] = []
    private let changing = NSLock()  // one address change at a time
    private let roamingStop = DispatchSemaphore(value: 0)
    private let roamingFinished = DispatchSemaphore(value: 0)
    private static let counter = NSLock()
    nonisolated(unsafe) private static var made = 0

    /// Builds `hostCount` hosts joined by a wire applying `profile`, its random draws from `seed`.
    public init(hostCount: Int, profile: LinkProfile, seed: UInt64 = UInt64.random(in: 0...UInt64.max)) throws {
        guard Self.hostCounts.contains(hostCount) else { throw NetLabError.unavailable("a lab has \(Self.hostCounts) hosts") }
        guard geteuid() == 0 else { throw NetLabError.unavailable("the lab needs root (it creates network namespaces)") }
        guard ChildProcess.which("ip") != nil else { throw NetLabError.unavailable("the lab needs ip (iproute2)") }
        if let roaming = profile.addressChanges {
            guard (0..<hostCount).contains(roaming.host) else { throw NetLabError.unavailable("the roaming host is not in the lab") }
            guard roaming.periodNanoseconds >= AddressChangePattern.minimumPeriodNanoseconds else {
                throw NetLabError.unavailable("an address change period is at least \(AddressChangePattern.minimumPeriodNanoseconds) ns")
            }
        }
        Self.removeLeftovers()
        let serial = Self.counter.withLock { () -> Int in
            Self.made += 1
            return Self.made
        }
        let names = (0..<hostCount).map { "\(Self.namePrefix)\(getpid())-\(serial)\(Character(UnicodeScalar(UInt8(97 + $0))))" }
        var taps: [Int32] = []
        var made: [String] = []
        do {
            for (index, name) in names.enumerated() {
                try Self.ip(["netns", "add", name])
                made.append(name)
                try Self.withNetworkNamespace(named: name) {
                    for scope in ["all", "default"] {
                        try? "1\n".write(toFile: "/proc/sys/net/ipv6/conf/\(scope)/disable_ipv6", atomically: false, encoding: .utf8)
                    }
                }
                var deviceName = [CChar](repeating: 0, count: 32)
                let descriptor = cnetlab_open_tap("tlab%d", &deviceName, deviceName.count)
                guard descriptor >= 0 else { throw NetLabError.system("opening /dev/net/tun as a TAP device", -descriptor) }
                taps.append(descriptor)
                let device = String(decoding: deviceName.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
                try Self.ip(["link", "set", device, "netns", name])
                try Self.ip(["-n", name, "link", "set", device, "name", Self.interfaceName])
                try Self.ip(["-n", name, "addr", "add", "\(Self.subnet).\(index + 1)/24", "dev", Self.interfaceName])
                try Self.ip(["-n", name, "link", "set", Self.interfaceName, "up"])
                try Self.ip(["-n", name, "link", "set", "lo", "up"])
                try Self.ip(["-n", name, "route", "add", "224.0.0.0/4", "dev", Self.interfaceName])
            }
            stage = try WireStage(ports: taps, profile: profile, seed: seed)
        } catch {
            for descriptor in taps { Glibc.close(descriptor) }
            for name in made { _ = try? Self.ip(["netns", "del", name]) }
            throw error
        }
        self.taps = taps
        self.profile = profile
        hosts = names.enumerated().map { Host(namespace: $1, address: Self.address(ofHost: $0, afterChanges: 0)) }
        stage.start()
        if let roaming = profile.addressChanges { startRoaming(roaming) }
    }

    /// The address host `index` holds after `changes` address changes: `.index+1` at first, then in turn
    /// ``roamingAddresses`` others from `.32` on, 8 apart so that no two hosts ever share one.
    public static func address(ofHost index: Int, afterChanges changes: Int) -> String {
        guard changes > 0 else { return "\(subnet).\(index + 1)" }
        return "\(subnet).\(32 + ((changes - 1) % roamingAddresses) * 8 + index)"
    }

    /// The address host `index` holds now.
    public func address(ofHost index: Int) -> String {
        lock.withLock { changes.last { $0.host == index }?.address } ?? hosts[index].address
    }

    /// The address changes made so far, oldest first.
    public var addressChanges: [AddressChange] { lock.withLock { changes } }
    /// Address changes that failed (the `ip` command's error), oldest first.
    public var addressChangeFailures: [String] { lock.withLock { changeFailures } }

    /// Replaces host `index`'s address with its next one (``address(ofHost:afterChanges:)``): `ip addr del`,
    /// then `ip addr add`, as a phone that joined another access point sees it. The profile's roaming
    /// calls it on its timer; a test may call it too.
    @discardableResult
    public func replaceAddress(ofHost index: Int) throws -> AddressChange {
        try changing.withLock {
            let (previous, count) = lock.withLock { () -> (String?, Int) in
                let mine = changes.filter { $0.host == index }
                return (mine.last?.address, mine.count)
            }
            let old = previous ?? hosts[index].address
            let new = Self.address(ofHost: index, afterChanges: count + 1)
            let namespace = hosts[index].namespace
            try Self.ip(["-n", namespace, "addr", "del", "\(old)/24", "dev", Self.interfaceName])
            try Self.ip(["-n", namespace, "addr", "add", "\(new)/24", "dev", Self.interfaceName])
            let change = AddressChange(host: index, previous: old, address: new, at: .now)
            lock.withLock { changes.append(change) }
            return change
        }
    }

    /// Runs the profile's address changes on a thread of their own until ``close()``.
    private func startRoaming(_ pattern: AddressChangePattern) {
        let (stop, finished) = (roamingStop, roamingFinished)
        // Weakly: a lab nobody closes is still closed (and its namespaces deleted) by its deinit.
        let thread = Thread { [weak self] in
            let period = Double(pattern.periodNanoseconds) / 1e9
            var next = Date().addingTimeInterval(period)
            // Waits for the next change, or for close (which signals the semaphore).
            while stop.wait(timeout: .now() + max(0, next.timeIntervalSinceNow)) == .timedOut {
                guard let lab = self else { break }
                do {
                    try lab.replaceAddress(ofHost: pattern.host)
                } catch {
                    lab.lock.withLock { lab.changeFailures.append("\(error)") }
                }
                next = next.addingTimeInterval(period)
            }
            finished.signal()
        }
        thread.name = "netlab roaming"
        thread.start()
    }

    deinit { close() }

    /// Stops the wire and deletes every host (with whatever still runs in it losing its network). Idempotent.
    public func close() {
        guard lock.withLock({ () -> Bool in
            defer { closed = true }
            return !closed
        }) else { return }
        if profile.addressChanges != nil {
            roamingStop.signal()
            roamingFinished.wait()
        }
        stage.stop()
        for descriptor in taps { Glibc.close(descriptor) }
        for host in hosts { _ = try? Self.ip(["netns", "del", host.namespace]) }
    }

    /// What the wire did so far, every direction summed.
    public var counters: LinkCounters { stage.counters }
    /// Outages (flaps) the wire has applied so far.
    public var outages: Int { stage.outages }

    /// The command line that runs `arguments` inside host `index` (`ip netns exec`, which execs: the
    /// process started is the command itself).
    public func command(inHost index: Int, _ arguments: [String]) -> [String] {
        ["ip", "netns", "exec", hosts[index].namespace] + arguments
    }

    /// Runs `body` on the calling thread moved into host `index`'s namespace, then moves it back:
    /// sockets `body` creates belong to the host (they stay there after). `body` must not suspend.
    public func inHost<T>(_ index: Int, _ body: () throws -> T) throws -> T {
        try Self.withNetworkNamespace(named: hosts[index].namespace, body)
    }

    /// Runs `body` on the calling thread moved into the named namespace (`ip netns`), then moves it back.
    public static func withNetworkNamespace<T>(named name: String, _ body: () throws -> T) throws -> T {
        let original = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)
        guard original >= 0 else { throw NetLabError.system("opening this thread's network namespace", errno) }
        defer { Glibc.close(original) }
        let target = open("/run/netns/\(name)", O_RDONLY | O_CLOEXEC)
        guard target >= 0 else { throw NetLabError.system("opening network namespace \(name)", errno) }
        defer { Glibc.close(target) }
        let entered = cnetlab_enter_network_namespace(target)
        guard entered == 0 else { throw NetLabError.system("setns into \(name)", -entered) }
        defer {
            // A thread left in another namespace would put every later socket of the process's pool there.
            let back = cnetlab_enter_network_namespace(original)
            precondition(back == 0, "netlab: could not move the thread back to its network namespace (errno \(-back))")
        }
        return try body()
    }

    /// Deletes lab namespaces whose creating process no longer exists.
    public static func removeLeftovers() {
        guard let listing = try? ip(["netns", "list"]) else { return }
        for line in listing.split(separator: "\n") {
            let name = String(line.split(separator: " ").first ?? "")
            guard name.hasPrefix(namePrefix), let pid = Int32(name.dropFirst(namePrefix.count).prefix { $0 != "-" }),
                  kill(pid, 0) != 0 && errno == ESRCH else { continue }
            _ = try? ip(["netns", "del", name])
        }
    }

    @discardableResult
    static func ip(_ arguments: [String]) throws -> String {
        let result = try ChildProcess.run("ip", arguments, timeout: commandTimeout)
        guard result.status == 0 else { throw NetLabError.command("ip " + arguments.joined(separator: " "), result.output) }
        return result.output
    }
}
