import Crypto
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliNodeCore
import ThaliPSKTLS
import ThaliSSDP

/// Everything peer mode needs to know and every bound it keeps (spec/conformance.md, "Peer mode").
public struct PeerConformanceConfiguration: Sendable {
    /// The public key of the implementation under test.
    public var peerKey: PublicKey
    /// The suite's identity, which the implementation under test has as a contact.
    public var identity: PrivateKey
    /// Our IPv4 address: SSDP is pinned to it, our port listens on it.
    public var address: String
    /// SSDP multicast group.
    public var ssdpGroup = SSDPDiscoveryConfiguration.defaultGroupAddress
    /// SSDP port.
    public var ssdpPort = SSDPDiscoveryConfiguration.defaultPort
    /// The implementation's beacon location, when known: then it is fetched there instead of waiting for
    /// SSDP to find it (SSDP still announces the suite for the sender role).
    public var location: BeaconLocation?
    /// The implementation over Bluetooth instead of Wi-Fi: the suite opens one link to it
    /// (``SuiteBluetoothLink``), whose local port is its location, and the implementation reaches the suite
    /// over the same link; SSDP is not used (its cases are N/A).
    public var bluetooth: SuiteBluetoothTarget?
    /// Drives the implementation (queue an item for us, read its inbox); nil: an item must already be
    /// queued for us, and the inbox is not checked.
    public var adapter: ConformanceAdapter?
    /// The name under which the implementation has the suite as a contact (for the adapter's `send`).
    public var nameAtPeer = "conformance"
    /// Whether to add the suite as a contact through the adapter first.
    public var addContact = false
    /// Beacon profile of both sides.
    public var profile: BeaconProfile = .spec
    /// Longest wait for the implementation's beacons for us (SSDP, or polling the location).
    public var discoveryTimeout: TimeAmount = .seconds(15)
    /// Longest wait for any one step (a frame, a handshake, the implementation connecting back).
    public var stepTimeout: TimeAmount = .seconds(10)
    /// Largest item the suite receives; a larger offer is refused (`tooLarge`), which the spec allows.
    public var maxItemBytes: UInt64 = 16 << 20
    /// Clock difference forgiven when judging expirations and creation times.
    public var clockSkewMilliseconds: UInt64 = 5_000
    /// Longest wait for the answer to our close_notify: an implementation answers at once, so anything
    /// longer is waiting for a timer, not for the network.
    public var closeNotifyTimeout: TimeAmount = .seconds(2)
    /// Longest wait for the answer to a renegotiation we ask for inside a session: an implementation
    /// answers at once (with no_renegotiation), so silence this long is a request ignored.
    public var renegotiationTimeout: TimeAmount = .seconds(2)
    /// Longest wait, after queuing an item through the adapter, for a second announcement of its when SSDP
    /// has fetched only one (BCN-1.3 compares their ephemeral keys): ours announces anew for a new item
    /// within its outbox poll (1 s).
    public var announcementWait: TimeAmount = .seconds(3)
    /// How many identical searches (`MX: 1`) go out at once to see how their answers are delayed (SSDP-4.3).
    public var searchesAtOnce = 8
    /// Lateness of a search answer forgiven beyond min(MX, 5) s: the network, and scheduling on a loaded host.
    public var searchDelayTolerance: TimeAmount = .milliseconds(500)
    /// Whether to play the sender too (we deliver an item to it).
    public var senderRole = true
    /// How long a version 3 sender may send nothing before the suite, as receiver, reports its progress:
    /// the suite reports only once the sender stops, so a sender that streams past the window it was given
    /// is seen doing so. Longer makes that case stricter on a slow sender, and the run slower.
    public var windowQuietPeriod: TimeAmount = .milliseconds(250)
    /// How long the raw multiplexer cases still wait for a frame (an RST, a GoAway) once the implementation
    /// has answered the Ping sent behind the frames that call for it: it has read them by then, and an
    /// answer it sends from another task may trail its Ping answer by a little. Without this fence a
    /// session that ignores the frames costs the whole ``stepTimeout``.
    public var fenceGrace: TimeAmount = .milliseconds(500)
    /// How long those cases wait for the frame they call for before they send the Ping: an
    /// implementation that ends the session at once is seen ending it, and no Ping reaches it after its
    /// close (its kernel would reset the connection, which can drop its GoAway on our side).
    public var fenceDelay: TimeAmount = .milliseconds(250)

    /// A configuration for testing `peerKey` as `identity` from `address`.
    public init(peerKey: PublicKey, identity: PrivateKey, address: String) {
        self.peerKey = peerKey
        self.identity = identity
        self.address = address
    }

    /// Delivery bounds of the suite: the largest frame any configuration of ours accepts (16 MiB), the
    /// step timeout as idle timeout.
    var deliveryLimits: DeliveryLimits {
        DeliveryLimits(maxFramePayloadBytes: 16 << 20, maxItemBytes: maxItemBytes, maxTextBytes: maxItemBytes,
                       idleTimeout: .nanoseconds(stepTimeout.nanoseconds))
    }
}

/// Peer mode: the suite is a contact of the implementation under test and grades every layer between
/// them, in both delivery roles, then the negative TLS cases.
public struct PeerConformance: Sendable {
    /// Bounds and keys.
    public let configuration: PeerConformanceConfiguration
    let group: EventLoopGroup

    /// Peer mode with `configuration`, its connections on `group`.
    public init(configuration: PeerConformanceConfiguration, group: EventLoopGroup) {
        self.configuration = configuration
        self.group = group
        announcements = NIOLockedValueBox(AnnouncementKeyLog(profile: configuration.profile))
    }

    /// Runs every case, recording each into `run` as it ends. Cancelling the task stops the run; what
    /// was recorded stays in `run`.
    public func run(_ run: ConformanceRun) async {
        let configuration = self.configuration
        let limits = configuration.deliveryLimits
        var queuedIDs: [UUID] = []
        // Followed from the start, so that no report of the sessions below is missed.
        let events: AdapterEventFollower? = configuration.adapter.flatMap { try? AdapterEventFollower(adapter: $0) }
        defer { events?.stop() }
        // Before anything is queued, so that its announcing starts while its events are followed.
        let ownAlivesWatch = await watchForOwnAlives(events: events)
        if let adapter = configuration.adapter {
            do {
                if configuration.addContact {
                    try await adapter.addContact(name: configuration.nameAtPeer, key: configuration.identity.publicKey)
                }
                // Longer than the frame maximum and the progress window our welcome announces, so that the
                // frame-maximum and window cases bite; then two short texts, which a version 3 sender
                // sends whole, as a batch of item frames.
                let filler = Self.filler
                queuedIDs.append(try await adapter.send(text: "thali-conformance receiver test \(UUID().uuidString) \(filler)",
                                                        to: configuration.nameAtPeer))
                for index in 1...2 {
                    queuedIDs.append(try await adapter.send(text: "thali-conformance batch text \(index) \(UUID().uuidString)",
                                                            to: configuration.nameAtPeer))
                }
            } catch {
                run.note("adapter: \(error); expecting an item already queued for us")
            }
        } else {
            run.note("no adapter: expecting an item already queued for us; the inbox is not checked")
        }

        let server: PeerSuiteServer
        do {
            server = try await PeerSuiteServer.start(host: configuration.address, peer: configuration.peerKey,
                                                     limits: limits, group: group)
        } catch {
            run.note("cannot start the suite's port on \(configuration.address): \(error)")
            run.recordRemaining(Cases.all, .inconclusive, because: "the suite could not start")
            return
        }
        if let bluetooth = configuration.bluetooth {
            await runOverBluetooth(run, bluetooth, server: server, queuedIDs: queuedIDs, events: events)
            return
        }
        let discovery: SSDPDiscoveryService
        let fetched: AsyncStream<(SSDPPeer, [UInt8])>
        do {
            var ssdp = SSDPDiscoveryConfiguration(interfaceAddress: configuration.address)
            ssdp.groupAddress = configuration.ssdpGroup
            ssdp.port = configuration.ssdpPort
            ssdp.beaconServer = .external(port: server.port)
            let (stream, sink) = AsyncStream.makeStream(of: (SSDPPeer, [UInt8]).self, bufferingPolicy: .bufferingNewest(64))
            fetched = stream
            let announcements = self.announcements
            discovery = SSDPDiscoveryService(configuration: ssdp, group: group) { peer, bytes in
                announcements.withLockedValue { $0.record(bytes, from: peer.location) }
                sink.yield((peer, bytes))
            }
            try await discovery.start(advertising: nil)
        } catch {
            await server.close()
            run.note("cannot start SSDP on \(configuration.address): \(error)")
            run.recordRemaining(Cases.all, .inconclusive, because: "the suite could not start")
            return
        }
        await roles(run, server: server, discovery: discovery, fetched: fetched, queuedIDs: queuedIDs, events: events,
                    ownAlivesWatch: ownAlivesWatch)
    }

    /// Both delivery roles, then (with SSDP stopped and the suite's port closed) the cases on the
    /// implementation's port: negative TLS, raw multiplexer, marking. Without `discovery` (over Bluetooth)
    /// the implementation is at ``PeerConformanceConfiguration/location`` and finds the suite there too.
    /// `events` are the implementation's own reports, through the adapter; `ownAlivesWatch`, what the
    /// SSDP probe before the first `send` learnt of them (``watchForOwnAlives(events:)``).
    func roles(_ run: ConformanceRun, server: PeerSuiteServer, discovery: SSDPDiscoveryService?,
               fetched: AsyncStream<(SSDPPeer, [UInt8])>, queuedIDs: [UUID], events: AdapterEventFollower?,
               ownAlivesWatch: OwnAlivesWatch = OwnAlivesWatch()) async {
        let configuration = self.configuration
        let limits = configuration.deliveryLimits
        await receiverRole(run, fetched: fetched, queuedIDs: queuedIDs, limits: limits)
        await gradeWithdrawal(run, events: discovery?.events)
        if configuration.senderRole && !Task.isCancelled {
            await senderRole(run, server: server, discovery: discovery, limits: limits)
        } else {
            run.recordRemaining(Cases.senderRole, .notApplicable, because: "sender role not run")
        }
        await discovery?.stop()
        let suiteLocation = BeaconLocation(host: configuration.address, port: server.port)
        await server.close()
        let found = lastMatch.withLockedValue { $0 }
        gradeEphemeralKeys(run, location: found?.1)
        if let (match, location) = found, !Task.isCancelled {
            await gradeUncleanClose(run, events: events, location: location, match: match)
            gradeOwnAlivesDropped(run, events: events, own: location, suite: suiteLocation, watch: ownAlivesWatch)
        }
        if let location = found?.1 ?? configuration.location, !Task.isCancelled {
            await negativeCases(run, location: location, match: found?.0)
            if let match = found?.0, !Task.isCancelled {
                await gradeRawMultiplexer(run, against: .keyed(match, location))
            }
            if let match = found?.0, !Task.isCancelled {
                await markingCases(run, location: location, match: match)
            }
            if let match = found?.0, !Task.isCancelled {
                await gradeSendWindow(run, location: location, match: match)
            }
        }
        run.recordRemaining(Cases.all, .inconclusive, because: Task.isCancelled ? "interrupted"
                                : run.firstFailure.map { "not reached: \($0.id) failed first" } ?? "not reached")
    }

    /// Every announcement SSDP fetched, for BCN-1.3.
    let announcements: NIOLockedValueBox<AnnouncementKeyLog>

    /// The announcements fetched from its location over the run, once SSDP has stopped [BCN-1.3]. One
    /// announcement is N/A: a node makes a new one for a new item, and a run that queued nothing (no
    /// adapter) may see just one.
    func gradeEphemeralKeys(_ run: ConformanceRun, location: BeaconLocation?) {
        let expected = "a different ephemeral key in each announcement"
        // Over Bluetooth the announcements are those the suite fetched over the link.
        let logged = configuration.location == nil || configuration.bluetooth != nil
        guard let location, logged else {
            run.record(Cases.freshEphemeralKey, logged ? .inconclusive : .notApplicable, expected: expected,
                       actual: logged ? "no announcement of its matched" : "location given: SSDP not used to find it")
            return
        }
        let log = announcements.withLockedValue { $0 }
        guard let (holds, actual) = log.judge(location) else {
            run.record(Cases.freshEphemeralKey, .notApplicable, expected: expected,
                       actual: "\(log.count(location)) announcement(s) fetched from \(location): nothing to compare")
            return
        }
        run.grade(Cases.freshEphemeralKey, holds: holds, expected: expected, actual: actual)
    }

    /// The USN under which SSDP found the implementation's announcement for us.
    let usn = NIOLockedValueBox<String?>(nil)

    /// The beacon match of the receiver role and where it was found (the negative cases use both).
    let lastMatch = NIOLockedValueBox<(BeaconMatch, BeaconLocation)?>(nil)


    // MARK: Helpers

    /// Runs `body` until it returns or `timeout` passes (then nil); `body` is cancelled at the deadline.
    func withDeadline<T: Sendable>(_ timeout: TimeAmount, _ body: @escaping @Sendable () async -> T?) async -> T? {
        await withTaskGroup(of: T?.self) { tasks in
            tasks.addTask { await body() }
            tasks.addTask {
                try? await Task.sleep(nanoseconds: UInt64(max(0, timeout.nanoseconds)))
                return nil
            }
            let first = await tasks.next() ?? nil
            tasks.cancelAll()
            return first
        }
    }

    /// Grades the first beacon request it sent us against the client's rules [SSDP-6.6, SSDP-6.8]. With
    /// `host` nil (over Bluetooth: it fetched a local port of its own) Host must be one `host:port`.
    static func gradeBeaconRequest(_ run: ConformanceRun, _ request: HTTPRequestHead, host: String?) {
        let expected = "GET \(BeaconLocation.notificationBeaconsPath) HTTP/1.1, Host: \(host ?? "host:port (the port it connected to)"), "
            + "Connection: close, Accept: application/octet-stream"
        let connection = request.headers[canonicalForm: "Connection"].map { $0.lowercased() }
        let accept = request.headers[canonicalForm: "Accept"].map { $0.split(separator: ";").first?.trimmingCharacters(in: .whitespaces).lowercased() }
        let hostHolds = host.map { request.headers["Host"] == [$0] } ?? (request.headers["Host"].count == 1
            && request.headers["Host"].first.map(hasPort) == true)
        let holds = request.method == .GET && request.uri == BeaconLocation.notificationBeaconsPath && request.version == .http1_1
            && hostHolds && connection.contains("close") && accept.contains("application/octet-stream")
        let shown = ["Host", "Connection", "Accept"].map { name in
            "\(name): \(request.headers[name].joined(separator: ", ").prefix(80))"
        }
        run.grade(Cases.senderBeaconRequest, holds: holds, expected: expected,
                  actual: "\(request.method.rawValue) \(request.uri.prefix(80)) \(request.version), \(shown.joined(separator: ", "))")
    }

    /// Whether a Host value ends in `:PORT`, a port number from 1 to 65535.
    static func hasPort(_ host: String) -> Bool {
        guard let colon = host.lastIndex(of: ":") else { return false }
        let digits = host[host.index(after: colon)...]
        guard !digits.isEmpty, digits.count <= 5, digits.allSatisfy({ ("0"..."9").contains($0) }), let port = Int(digits) else { return false }
        return (1...65_535).contains(port)
    }

    /// Why the SSDP cases do not apply over Bluetooth.
    static let overBluetooth = "over Bluetooth: no SSDP"

    /// Why a case that needs SSDP's view of the implementation does not apply to this run.
    var ssdpNotUsed: String {
        configuration.bluetooth == nil ? "location given: SSDP not used to find it" : Self.overBluetooth
    }

    static func text(_ amount: TimeAmount) -> String {
        let milliseconds = amount.nanoseconds / 1_000_000
        return milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }
}
