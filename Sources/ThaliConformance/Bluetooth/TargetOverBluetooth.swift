import NIOConcurrencyHelpers
import NIOCore
import ThaliBLEBinding
import ThaliBeacons

/// How target mode reaches the implementation over Bluetooth (spec/conformance.md, "Target mode over
/// Bluetooth"): every scripted peer opens a link of its own, one after another, from the address of its
/// transport.
public struct TargetBluetoothLinks: Sendable {
    /// The implementation: its address and channel (and the transport of the first link).
    public var target: SuiteBluetoothTarget
    /// The transport of the n-th scripted peer's link (n from 0), whose local address is that peer's. With
    /// the stand-in each can be another address; on RFCOMM every one is the adapter's.
    public var transportForPeer: @Sendable (Int) -> any BluetoothTransport
    /// How long the replay case waits on the link that made the session for the implementation to fetch
    /// the same announcement again over it (ours fetches again every 5 s while a link lasts).
    public var refetchWait: TimeAmount = .seconds(8)
    /// How long, after a link's `00` hello, the suite waits for the implementation's beacon request before
    /// a step's observation period starts (BLE-3.4 asks for the fetch, not for its speed; a loaded host or
    /// a radio may take a while).
    public var fetchWait: TimeAmount = .seconds(10)

    /// Links to `target`, the n-th from `transportForPeer(n)` (default: `target.transport` for all).
    public init(target: SuiteBluetoothTarget, transportForPeer: (@Sendable (Int) -> any BluetoothTransport)? = nil) {
        self.target = target
        let transport = target.transport
        self.transportForPeer = transportForPeer ?? { _ in transport }
    }
}

/// The scripted peers' links, one open at a time: a new peer's link replaces the last one, so that a
/// location served earlier is not fetched again over an old link while a later step watches.
final class TargetLinkChain: Sendable {
    private let links: TargetBluetoothLinks
    private let host: String
    private let group: any EventLoopGroup
    private let state = NIOLockedValueBox<(link: SuiteBluetoothLink?, opened: Int)>((nil, 0))

    init(links: TargetBluetoothLinks, host: String, group: any EventLoopGroup) {
        self.links = links
        self.host = host
        self.group = group
    }

    /// Closes the current link and opens the next peer's, its inbound streams joined to `host:port`.
    /// - Throws: ``SuiteBluetoothLinkError``.
    func next(joining port: Int) async throws {
        let (previous, index) = state.withLockedValue { state in
            defer {
                state.link = nil
                state.opened += 1
            }
            return (state.link, state.opened)
        }
        await previous?.close()
        var target = links.target
        target.transport = links.transportForPeer(index)
        let link = try await SuiteBluetoothLink.open(target, joiningInboundTo: port, on: host, group: group)
        state.withLockedValue { $0.link = link }
    }

    /// Closes the current link.
    func close() async {
        await state.withLockedValue { state in
            defer { state.link = nil }
            return state.link
        }?.close()
    }
}

extension TargetConformance {
    /// Why the SSDP cases do not apply over Bluetooth.
    static let overBluetooth = "over Bluetooth: no SSDP"

    /// The cases that grade SSDP alone: N/A over Bluetooth.
    static let ssdpOnly = [Cases.searchForm, Cases.validFetched, Cases.fetchOnce, Cases.malformed, Cases.foreignNT, Cases.badUSN,
                           Cases.spoofedLocation, Cases.forgedByebye, Cases.forgotten]

    /// Every case a run over Bluetooth reports: target mode's, and the surprise fetch (BLE-3.4), the control.
    public static var casesOverBluetooth: [ConformanceCase] { [BluetoothConformance.Cases.surpriseFetch] + Cases.all }

    /// Target mode over Bluetooth: a first link, joined to a location that serves a stream for nobody,
    /// must be fetched at once (BLE-3.4, the control: without it the rest is INCONCLUSIVE) and lead to no
    /// connection (BCN-4.8); then the beacon, TLS and stream cases, each scripted peer on a link of its
    /// own; then the busy location. The SSDP cases are N/A.
    func runOverBluetooth(_ run: ConformanceRun, _ links: TargetBluetoothLinks) async {
        for testCase in Self.ssdpOnly {
            run.record(testCase, .notApplicable, expected: testCase.title, actual: Self.overBluetooth)
        }
        let chain = TargetLinkChain(links: links, host: configuration.address, group: group)
        do {
            try await linkScript(run, links, chain)
        } catch {
            run.note("target mode stopped: \(error)")
            run.recordRemaining(Self.casesOverBluetooth, .inconclusive, because: "the run stopped: \(error)")
        }
        await chain.close()
    }

    /// Whether `fetches` rose above `before` within `timeout` (polled every 20 ms).
    static func fetched(_ before: Int, within timeout: TimeAmount, _ fetches: @Sendable () -> Int) async -> Bool {
        let deadline = NIODeadline.now() + timeout
        while fetches() <= before {
            guard NIODeadline.now() < deadline, !Task.isCancelled else { return false }
            try? await Task.sleep(nanoseconds: 20_000_000)
        }
        return true
    }

    private func linkScript(_ run: ConformanceRun, _ links: TargetBluetoothLinks, _ chain: TargetLinkChain) async throws {
        let observation = configuration.observation
        // A stream with one beacon, for a key nobody holds: well formed, and for nobody we know.
        let stream = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(600)).stream
        let nobody = try await ScriptedLocation.start(host: configuration.address, body: stream, group: group)
        defer { nobody.close() }
        let surprise = BluetoothConformance.Cases.surpriseFetch
        let expected = "GET /NotificationBeacons over the link within \(PeerConformance.text(links.fetchWait)) of our 00 hello"
        var started = NIODeadline.now()
        do {
            try await chain.next(joining: nobody.port)
        } catch {
            run.note("\(error)")
            run.grade(surprise, holds: false, expected: expected, actual: "\(error)", started: started)
            run.recordRemaining(Self.casesOverBluetooth, .inconclusive, because: "no Bluetooth link: \(error)")
            return
        }
        let fetched = await Self.fetched(0, within: links.fetchWait) { nobody.fetches }
        run.grade(surprise, holds: fetched, expected: expected,
                  actual: fetched ? "fetched after \(PeerConformance.text(.now() - started))" : "no fetch in \(PeerConformance.text(links.fetchWait))",
                  started: started)
        guard nobody.fetches >= 1 else {
            run.recordRemaining(Self.casesOverBluetooth, .inconclusive, because: "it fetched nothing over our link after our 00 hello")
            return
        }
        // One period after the fetch: a connection would have come by then.
        try await Task.sleep(for: .nanoseconds(observation.nanoseconds))
        run.grade(Cases.noMatchNoConnect, holds: nobody.otherConnections == 0,
                  expected: "no connection but beacon fetches over the link", actual: "\(nobody.otherConnections) other connections (TLS or not HTTP)")

        let fetchWait = links.fetchWait
        try await beaconCases(run, announcer: Announcer(announce: { port, fetches in
            let before = fetches()
            try await chain.next(joining: port)
            _ = await Self.fetched(before, within: fetchWait, fetches)
        }, replayWait: max(observation, links.refetchWait)))

        // Last, as over Wi-Fi: a busy location on a link of its own, watched for the Retry-After and one
        // period (the link's own refetches are the temptation to ask sooner).
        let busy = try await ScriptedLocation.start(host: configuration.address, body: stream, busyRetryAfter: Self.busyRetryAfterSeconds,
                                                    group: group)
        defer { busy.close() }
        started = NIODeadline.now()
        try await chain.next(joining: busy.port)
        _ = await Self.fetched(0, within: links.fetchWait) { busy.fetches }
        try await Task.sleep(for: .nanoseconds((TimeAmount.seconds(Int64(Self.busyRetryAfterSeconds)) + observation).nanoseconds))
        // The link refetches on its own schedule (every 5 s), not on alives: asking again is not required here.
        judgeBusy(run, busy, started: started, retryRequired: false)
    }
}
