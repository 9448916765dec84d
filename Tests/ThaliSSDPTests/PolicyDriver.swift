import NIOCore
import Testing
import ThaliTestSupport

@testable import ThaliSSDP

/// Drives an `SSDPDiscoveryPolicy` in virtual time as `SSDPDiscoveryService` does over sockets: the
/// timers the policy arms (its periodic alive, search and housekeeping ticks among them) fire in time
/// order as the test lets time pass; fetches wait until the test finishes them; a rejoin succeeds at once. No sockets,
/// no clock, no sleeps: a test of minutes of discovery runs in milliseconds.
struct PolicyDriver {
    typealias Action = SSDPDiscoveryPolicy.Action

    var policy: SSDPDiscoveryPolicy
    let configuration: SSDPDiscoveryConfiguration
    private(set) var now = NIODeadline.uptimeNanoseconds(1_000_000_000)
    /// Every action so far, in order.
    private(set) var actions: [Action] = []
    /// Armed timers not fired yet.
    private(set) var timers: [(timer: SSDPDiscoveryPolicy.Timer, deadline: NIODeadline)] = []
    /// Fetches started and not finished, oldest first.
    private(set) var fetches: [(location: BeaconLocation, serviceName: String)] = []
    /// Whether reading is paused, and the multicast socket open, as the service's sockets would be.
    private(set) var readingPaused = false
    private(set) var multicastOpen = true
    /// Peers that reached us over unicast (the service's count of requests answered and reported).
    var inboundUnicast = 0
    /// Where our beacons are served.
    let ourLocation: BeaconLocation

    init(_ configuration: SSDPDiscoveryConfiguration = SSDPDiscoveryConfiguration(interfaceAddress: "10.0.0.1"),
         advertising: Bool = false, seed: UInt64 = 1) {
        self.configuration = configuration
        policy = SSDPDiscoveryPolicy(configuration: configuration, random: SplitMix64(state: seed))
        ourLocation = BeaconLocation(host: configuration.interfaceAddress, port: 4242)
        policy.serve(at: ourLocation)
        record(policy.start(advertising: advertising, now: now))
    }

    // MARK: Inputs

    /// A datagram with `text` from `host`.
    @discardableResult
    mutating func receive(_ text: String, from host: String, port: Int = 1900) throws -> [Action] {
        try receive(Array(text.utf8), from: host, port: port)
    }

    /// A datagram of `bytes` from `host`.
    @discardableResult
    mutating func receive(_ bytes: [UInt8], from host: String, port: Int = 1900) throws -> [Action] {
        record(policy.received(datagram: bytes, from: try SocketAddress(ipAddress: host, port: port), now: now))
    }

    /// An alive for `usn` at `location` (from its own host unless `from` says otherwise).
    @discardableResult
    mutating func alive(_ usn: String, at location: BeaconLocation, from host: String? = nil, maxAge: Int = 60) throws -> [Action] {
        try receive(aliveText(port: 1900, usn: usn, location: "http://\(location.host):\(location.port)/NotificationBeacons",
                              maxAge: maxAge), from: host ?? location.host)
    }

    /// An M-SEARCH for `target` with MX `mx` from `host`.
    @discardableResult
    mutating func search(_ target: String = "ssdp:all", mx: Int = 1, from host: String = "10.0.0.9",
                         searcher: String? = nil) throws -> [Action] {
        var text = "M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nMAN: \"ssdp:discover\"\r\nMX: \(mx)\r\nST: \(target)\r\n"
        if let searcher { text += "S: \(searcher)\r\n" }
        return try receive(text + "\r\n", from: host, port: 50000)
    }

    /// Ends the oldest started fetch of `serviceName` (any, when nil) with `outcome`, its slot given back
    /// after the delivery, as the service does.
    @discardableResult
    mutating func finishFetch(_ serviceName: String? = nil, _ outcome: SSDPDiscoveryPolicy.FetchOutcome) -> [Action] {
        guard let index = fetches.firstIndex(where: { serviceName == nil || $0.serviceName == serviceName }) else { return [] }
        let fetch = fetches.remove(at: index)
        return record(policy.fetchFinished(fetch.serviceName, outcome: outcome, inboundUnicast: inboundUnicast, now: now))
            + record(policy.fetchEnded(now: now))
    }

    /// Ends every started fetch with `outcome`.
    mutating func finishAllFetches(_ outcome: SSDPDiscoveryPolicy.FetchOutcome) {
        while !fetches.isEmpty { finishFetch(nil, outcome) }
    }

    /// The app advertises new beacons (or none).
    @discardableResult
    mutating func advertise(_ advertising: Bool) -> [Action] { record(policy.advertise(advertising)) }

    /// A limit pauses announcing for `period`.
    @discardableResult
    mutating func pauseAnnouncing(for period: TimeAmount, kind: SSDPDiscoveryEvent.LimitKind) -> [Action] {
        record(policy.pauseAnnouncing(for: period, kind: kind, now: now))
    }

    /// Switches background mode; the alive timer is rearmed when the interval changed.
    mutating func setBackground(_ background: Bool) {
        record(policy.setBackground(background, now: now))
    }

    // MARK: Time

    /// Lets `duration` pass: ticks and timers due fire at their deadlines, in order.
    mutating func advance(by duration: TimeAmount) {
        let end = now + duration
        while let (deadline, fire) = nextDue(), deadline <= end {
            now = max(now, deadline)
            fire(&self)
        }
        now = end
    }

    /// The loop stops for `duration` (a starved peer): nothing runs; then whatever fell due runs once, late.
    mutating func stall(for duration: TimeAmount) {
        now = now + duration
        while let (deadline, fire) = nextDue(), deadline <= now { fire(&self) }
    }

    private func nextDue() -> (NIODeadline, (inout PolicyDriver) -> Void)? {
        guard let (index, armed) = timers.enumerated().min(by: { $0.element.deadline < $1.element.deadline }) else { return nil }
        return (armed.deadline, { driver in
            driver.timers.remove(at: index)
            driver.record(driver.policy.timerFired(armed.timer, now: driver.now, date: { "Thu, 01 Jan 2026 00:00:00 GMT" }))
        })
    }

    // MARK: Outputs

    @discardableResult
    private mutating func record(_ new: [Action]) -> [Action] {
        var all = new
        actions += new
        for action in new {
            switch action {
            case .send(let message, _): policy.countSent(message)
            case .startFetch(let location, let serviceName): fetches.append((location, serviceName))
            case .arm(let timer, let deadline): timers.append((timer, deadline))
            case .pauseReading(let paused): readingPaused = paused
            case .closeMulticast: multicastOpen = false
            case .rejoinGroup:
                multicastOpen = true
                all += record(policy.rejoined(now: now))
            case .emit, .deliver, .log: break
            }
        }
        return all
    }

    /// The events reported so far.
    var events: [SSDPDiscoveryEvent] { actions.compactMap { if case .emit(let event) = $0 { event } else { nil } } }
    /// The limits reported so far.
    var limitsTriggered: [SSDPDiscoveryEvent.LimitKind] {
        events.compactMap { if case .limitTriggered(let kind) = $0 { kind } else { nil } }
    }
    /// The messages sent so far, with their destination (nil: the group).
    var sent: [(message: SSDPMessage, to: SocketAddress?)] {
        actions.compactMap { if case .send(let message, let to) = $0 { (message, to) } else { nil } }
    }
    /// The alives sent so far.
    var alivesSent: Int {
        sent.filter { if case .notification(let notification) = $0.message { notification.subtype == .alive } else { false } }.count
    }
    /// The beacons handed to the consumer so far.
    var delivered: [(serviceName: String, bytes: [UInt8])] {
        actions.compactMap { if case .deliver(let peer, let bytes) = $0 { (peer.uniqueServiceName, bytes) } else { nil } }
    }
    /// The USNs whose fetch started so far, in order.
    var fetchesStarted: [String] {
        actions.compactMap { if case .startFetch(_, let serviceName) = $0 { serviceName } else { nil } }
    }
    /// The search answers armed now, waiting for their random delay.
    var searchAnswerTimers: [(timer: SSDPDiscoveryPolicy.Timer, deadline: NIODeadline)] {
        timers.filter { if case .searchAnswer = $0.timer { true } else { false } }
    }
    /// The timers armed now for `location`'s fetch.
    func spreadTimers(of location: BeaconLocation) -> [NIODeadline] {
        timers.compactMap { if case .fetchSpreadEnds(location) = $0.timer { $0.deadline } else { nil } }
    }
}

/// The location of a test peer at `host` (port 1000 unless said otherwise).
func peerLocation(_ host: String, port: Int = 1000) -> BeaconLocation { BeaconLocation(host: host, port: port) }

/// A fetch that got no TCP connection.
let refused = SSDPDiscoveryPolicy.FetchOutcome.failed(BeaconFetchFailure(.noConnection, "connection refused"))

/// A Thali USN (`uuid:<UUID>`) of its own for each `index`.
func usn(_ index: Int) -> String {
    let digits = String(index)
    return "uuid:00000000-0000-4000-8000-" + String(repeating: "0", count: max(0, 12 - digits.count)) + digits
}

/// The driver's clock: what the value tests take for "time passes" must fire ticks and armed timers at
/// their deadlines, in order, and a stall must fire what fell due only once, late.
@Suite struct PolicyDriverTests {
    @Test("time passing fires the periodic ticks at their intervals; a stall fires what fell due once")
    func ticksFireAtTheirDeadlines() {
        var driver = PolicyDriver(advertising: true)
        let start = driver.now
        let interval = driver.policy.aliveInterval
        let alivesAtStart = driver.alivesSent
        driver.advance(by: interval * 3)
        #expect(driver.now == start + interval * 3)
        #expect(driver.alivesSent - alivesAtStart >= 3, "an alive tick at each interval")
        let before = driver.alivesSent
        driver.stall(for: interval * 5)
        #expect(driver.now == start + interval * 8)
        #expect(driver.alivesSent - before <= 2, "a starved loop runs a due tick once, not once per interval missed")
        #expect(driver.alivesSent > before)
    }
}
