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
    /// Whether to play the sender too (we deliver an item to it).
    public var senderRole = true

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
                       idleTimeout: stepTimeout)
    }
}

/// Peer mode: the suite is a contact of the implementation under test and grades every layer between
/// them, in both delivery roles, then the negative TLS cases.
public struct PeerConformance: Sendable {
    /// The cases, in the order they run.
    public enum Cases {
        /// `peer/ssdp/discovered`: announces itself over SSDP with a LOCATION we can fetch.
        public static let discovered = ConformanceCase("peer/ssdp/discovered", "announces itself over SSDP with a LOCATION we can fetch",
                                                       ["SSDP-2.1", "SSDP-2.2", "SSDP-2.4", "SSDP-3.5"])
        /// `peer/ssdp/usn`: its USN is uuid: and a UUID in lower case.
        public static let usn = ConformanceCase("peer/ssdp/usn", "its USN is uuid: and a UUID in lower case", ["SSDP-2.3"])
        /// `peer/ssdp/search-answer`: an M-SEARCH for the Thali NT is answered by unicast to our port with CACHE-CONTROL, LOCATION, ST and USN.
        public static let searchAnswer = ConformanceCase("peer/ssdp/search-answer",
                                                         "an M-SEARCH for the Thali NT is answered by unicast to our port with CACHE-CONTROL, LOCATION, ST and USN",
                                                         ["SSDP-2.7"])
        /// `peer/ssdp/byebye`: once nothing is left for us it withdraws its announcement with a byebye.
        public static let byebye = ConformanceCase("peer/ssdp/byebye", "once nothing is left for us it withdraws its announcement with a byebye",
                                                   ["SSDP-2.5", "SSDP-4.2", "NODE-3.1"])
        /// `peer/http/beacons`: GET /NotificationBeacons answers 200 with the beacon stream.
        public static let beaconFetch = ConformanceCase("peer/http/beacons", "GET /NotificationBeacons answers 200 with the beacon stream",
                                                        ["SSDP-6.2", "SSDP-6.5"])
        /// `peer/beacons/match`: its announcement has a beacon for us that matches.
        public static let beaconMatch = ConformanceCase("peer/beacons/match", "its announcement has a beacon for us that matches",
                                                        ["BCN-1.1", "BCN-2.1", "BCN-2.2", "BCN-2.3", "BCN-2.4", "BCN-2.5", "BCN-4.7", "NODE-3.1"])
        /// `peer/beacons/expiration`: expiration is ahead, at most 24 h.
        public static let expiration = ConformanceCase("peer/beacons/expiration", "expiration is ahead, at most 24 h",
                                                       ["BCN-1.2", "BCN-4.3", "BCN-4.4"])
        /// `peer/psk-tls/handshake`: PSK-TLS with the beacon's identity and PSK: TLS 1.2, 0x00AB, DH ≥ 2048.
        public static let handshake = ConformanceCase("peer/psk-tls/handshake", "PSK-TLS with the beacon's identity and PSK: TLS 1.2, 0x00AB, DH ≥ 2048",
                                                      ["PSK-1.1", "PSK-1.2", "PSK-1.7", "PSK-3.1", "PSK-3.2", "BCN-2.6", "BCN-2.7", "NODE-2.1"])
        /// `peer/psk-tls/close-notify-answered`: our close_notify, with TCP kept open, is answered at once.
        public static let closeNotify = ConformanceCase("peer/psk-tls/close-notify-answered",
                                                        "our close_notify, with TCP kept open, is answered at once: its close_notify, then the connection closes",
                                                        ["PSK-6.4", "NODE-1.21"])
        /// `peer/yamux/open-stream`: a yamux stream we open is accepted and served.
        public static let openStream = ConformanceCase("peer/yamux/open-stream", "a yamux stream we open is accepted and served",
                                                       ["MUX-0.1", "MUX-1.1", "MUX-2.6", "NODE-3.3", "NODE-1.19"])
        /// `peer/delivery/hello`: the sender's first frame is hello, version 2.
        public static let hello = ConformanceCase("peer/delivery/hello", "the sender's first frame is hello, version 2", ["NODE-1.1", "NODE-1.4"])
        /// `peer/delivery/frame-maximum`: after our welcome announces 1024 bytes, its data frames stay within them.
        public static let frameMaximum = ConformanceCase("peer/delivery/frame-maximum",
                                                         "after our welcome announces a 1024-byte frame maximum, its data frames stay within it",
                                                         ["NODE-1.18", "NODE-1.23"])
        /// `peer/delivery/offer`: the queued item is offered, well formed, epoch milliseconds.
        public static let offer = ConformanceCase("peer/delivery/offer", "the queued item is offered, well formed, epoch milliseconds",
                                                  ["NODE-1.3", "NODE-1.5", "NODE-1.20"])
        /// `peer/delivery/transfer`: start(0), data and end carry exactly the offered bytes.
        public static let transfer = ConformanceCase("peer/delivery/transfer", "start(0), data and end carry exactly the offered bytes",
                                                     ["NODE-1.2", "NODE-1.8"])
        /// `peer/delivery/done`: after our acks the sender sends done.
        public static let done = ConformanceCase("peer/delivery/done", "after our acks the sender sends done", ["NODE-1.12", "NODE-1.13"])
        /// `peer/sender/connects`: it fetches our beacons and connects with our PSK.
        public static let senderConnects = ConformanceCase("peer/sender/connects", "it fetches our beacons and connects with our PSK",
                                                           ["SSDP-3.6", "NODE-3.2", "NODE-3.3", "PSK-3.1"])
        /// `peer/sender/beacon-request`: its beacon fetch is GET /NotificationBeacons HTTP/1.1, Host host:port, Connection: close, Accept: application/octet-stream.
        public static let senderBeaconRequest = ConformanceCase("peer/sender/beacon-request",
                                                                "its beacon fetch is GET /NotificationBeacons HTTP/1.1, Host host:port, Connection: close, Accept: application/octet-stream",
                                                                ["SSDP-6.6", "SSDP-6.8"])
        /// `peer/sender/welcome`: it answers our hello(2) with welcome: version 2 and its frame maximum, at least 1024.
        public static let senderWelcome = ConformanceCase("peer/sender/welcome",
                                                          "it answers our hello(2) with welcome: version 2 and its frame maximum, at least 1024",
                                                          ["NODE-1.22"])
        /// `peer/sender/opens-stream`: it opens a delivery stream and answers our offer.
        public static let senderStream = ConformanceCase("peer/sender/opens-stream", "it opens a delivery stream and answers our offer",
                                                         ["NODE-1.19", "NODE-1.3", "MUX-1.1"])
        /// `peer/sender/ack`: it acknowledges the item after end.
        public static let senderAck = ConformanceCase("peer/sender/ack", "it acknowledges the item after end", ["NODE-1.10"])
        /// `peer/sender/refuses-expired`: an item already expired is refused (reason 3).
        public static let refusesExpired = ConformanceCase("peer/sender/refuses-expired", "an item already expired is refused (reason 3)",
                                                           ["NODE-1.16", "NODE-1.20"])
        /// `peer/sender/rejects-damaged`: content that misses its SHA-256 gets reject.
        public static let rejectsDamaged = ConformanceCase("peer/sender/rejects-damaged", "content that misses its SHA-256 gets reject",
                                                           ["NODE-1.11"])
        /// `peer/sender/closes-after-done`: it closes the stream after done.
        public static let senderClose = ConformanceCase("peer/sender/closes-after-done", "it closes the stream after done", ["NODE-1.13"])
        /// `peer/sender/inbox`: the item is in its inbox once, from us, intact.
        public static let senderInbox = ConformanceCase("peer/sender/inbox", "the item is in its inbox once, from us, intact",
                                                        ["NODE-1.15", "NODE-3.4"])
        /// `peer/psk-tls/no-identity-hint`: the ServerKeyExchange carries no identity hint.
        public static let noHint = ConformanceCase("peer/psk-tls/no-identity-hint", "the ServerKeyExchange carries no identity hint", ["PSK-1.6"])
        /// `peer/psk-tls/unknown-identity`: an unknown identity gets unknown_psk_identity.
        public static let unknownIdentity = ConformanceCase("peer/psk-tls/unknown-identity", "an unknown identity gets unknown_psk_identity",
                                                            ["PSK-4.1", "PSK-4.2"])
        /// `peer/psk-tls/wrong-psk`: its own identity with a wrong PSK fails the handshake.
        public static let wrongPSK = ConformanceCase("peer/psk-tls/wrong-psk", "its own identity with a wrong PSK fails the handshake",
                                                     ["PSK-4.3"])
        /// `peer/psk-tls/tls13-refused`: a TLS 1.3-only hello gets protocol_version.
        public static let tls13 = ConformanceCase("peer/psk-tls/tls13-refused", "a TLS 1.3-only hello gets protocol_version", ["PSK-1.3"])
        /// `peer/psk-tls/other-suites-refused`: a hello without 0x00AB gets handshake_failure.
        public static let otherSuites = ConformanceCase("peer/psk-tls/other-suites-refused", "a hello without 0x00AB gets handshake_failure",
                                                        ["PSK-5.1", "PSK-1.2"])
        /// `peer/psk-tls/dh-group-size`: the DH prime has at least 2048 bits.
        public static let dhSize = ConformanceCase("peer/psk-tls/dh-group-size", "the DH prime has at least 2048 bits", ["PSK-2.1"])
        /// `peer/psk-tls/no-compression`: offered DEFLATE and none, it picks none.
        public static let noCompression = ConformanceCase("peer/psk-tls/no-compression", "offered DEFLATE and none, it picks none",
                                                          ["PSK-1.8"])
        /// `peer/psk-tls/no-session-tickets`: asked for a session ticket, it sends no ticket extension.
        public static let noTickets = ConformanceCase("peer/psk-tls/no-session-tickets", "asked for a session ticket, it sends no ticket extension",
                                                      ["PSK-1.4"])
        /// `peer/psk-tls/dh-fresh`: two handshakes carry different dh_Ys.
        public static let dhFresh = ConformanceCase("peer/psk-tls/dh-fresh", "two handshakes carry different dh_Ys", ["PSK-2.2"])

        /// Every case of peer mode.
        public static let all = [discovered, beaconFetch, beaconMatch, expiration, handshake, closeNotify, openStream, hello, offer,
                                 transfer, frameMaximum, done, usn, searchAnswer, byebye, senderConnects, senderBeaconRequest, senderWelcome, senderStream, senderAck, refusesExpired, rejectsDamaged, senderClose, senderInbox,
                                 noHint, noCompression, noTickets, unknownIdentity, wrongPSK, tls13, otherSuites, dhSize, dhFresh]
        static let receiverRole = [openStream, hello, offer, transfer, frameMaximum, done]
        static let senderRole = [senderConnects, senderBeaconRequest, senderWelcome, senderStream, senderAck, refusesExpired, rejectsDamaged, senderClose, senderInbox]
    }

    /// Bounds and keys.
    public let configuration: PeerConformanceConfiguration
    private let group: EventLoopGroup

    /// Peer mode with `configuration`, its connections on `group`.
    public init(configuration: PeerConformanceConfiguration, group: EventLoopGroup) {
        self.configuration = configuration
        self.group = group
    }

    /// Runs every case, recording each into `run` as it ends. Cancelling the task stops the run; what
    /// was recorded stays in `run`.
    public func run(_ run: ConformanceRun) async {
        let configuration = self.configuration
        let limits = configuration.deliveryLimits
        var queuedID: UUID?
        if let adapter = configuration.adapter {
            do {
                if configuration.addContact {
                    try await adapter.addContact(name: configuration.nameAtPeer, key: configuration.identity.publicKey)
                }
                // Longer than the frame maximum our welcome announces, so that the frame-maximum case bites.
                let filler = String(repeating: "0123456789abcdef", count: 192)
                queuedID = try await adapter.send(text: "thali-conformance receiver test \(UUID().uuidString) \(filler)",
                                                  to: configuration.nameAtPeer)
            } catch {
                run.note("adapter: \(error); expecting an item already queued for us")
            }
        } else {
            run.note("no adapter: expecting an item already queued for us; the inbox is not checked")
        }

        let server: PeerSuiteServer
        let discovery: SSDPDiscoveryService
        let fetched: AsyncStream<(SSDPPeer, [UInt8])>
        do {
            server = try await PeerSuiteServer.start(host: configuration.address, peer: configuration.peerKey,
                                                     limits: limits, group: group)
            var ssdp = SSDPDiscoveryConfiguration(interfaceAddress: configuration.address)
            ssdp.groupAddress = configuration.ssdpGroup
            ssdp.port = configuration.ssdpPort
            ssdp.beaconServer = .external(port: server.port)
            let (stream, sink) = AsyncStream.makeStream(of: (SSDPPeer, [UInt8]).self, bufferingPolicy: .bufferingNewest(64))
            fetched = stream
            discovery = SSDPDiscoveryService(configuration: ssdp, group: group) { peer, bytes in sink.yield((peer, bytes)) }
            try await discovery.start(advertising: nil)
        } catch {
            run.note("cannot start the suite's port or SSDP on \(configuration.address): \(error)")
            run.recordRemaining(Cases.all, .inconclusive, because: "the suite could not start")
            return
        }

        await receiverRole(run, fetched: fetched, queuedID: queuedID, limits: limits)
        await gradeWithdrawal(run, events: discovery.events)
        if configuration.senderRole && !Task.isCancelled {
            await senderRole(run, server: server, discovery: discovery, limits: limits)
        } else {
            run.recordRemaining(Cases.senderRole, .notApplicable, because: "sender role not run")
        }
        await discovery.stop()
        await server.close()
        let found = lastMatch.withLockedValue { $0 }
        if let location = found?.1 ?? configuration.location, !Task.isCancelled {
            await negativeCases(run, location: location, match: found?.0)
        }
        run.recordRemaining(Cases.all, .inconclusive, because: Task.isCancelled ? "interrupted" : "an earlier step failed")
    }

    /// The USN under which SSDP found the implementation's announcement for us.
    private let usn = NIOLockedValueBox<String?>(nil)

    /// The beacon match of the receiver role and where it was found (the negative cases use both).
    private let lastMatch = NIOLockedValueBox<(BeaconMatch, BeaconLocation)?>(nil)

    // MARK: Receiver role: it has an item for us

    private func receiverRole(_ run: ConformanceRun, fetched: AsyncStream<(SSDPPeer, [UInt8])>, queuedID: UUID?,
                              limits: DeliveryLimits) async {
        let configuration = self.configuration
        let receiver = BeaconReceiver(identity: configuration.identity, profile: configuration.profile)
        do { try receiver.addressBook.add(configuration.peerKey) } catch {}
        let started = NIODeadline.now()
        let found: (BeaconMatch, BeaconLocation)?
        if let location = configuration.location {
            run.record(Cases.discovered, .notApplicable, expected: Cases.discovered.title, actual: "location given: \(location)")
            found = await poll(location, receiver: receiver)
        } else {
            found = await firstMatch(in: fetched, receiver: receiver)
            if let found {
                run.record(Cases.discovered, .pass, expected: Cases.discovered.title, actual: "found at \(found.1)", started: started)
            } else {
                run.record(Cases.discovered, .fail, expected: "an alive whose beacons match within \(Self.text(configuration.discoveryTimeout))",
                           actual: "no announcement with a beacon for us was heard", started: started)
            }
        }
        guard let found else {
            run.recordRemaining([Cases.beaconFetch, Cases.beaconMatch, Cases.expiration, Cases.handshake, Cases.closeNotify] + Cases.receiverRole,
                                .inconclusive, because: "no beacon for us found")
            return
        }
        let (match, location) = found
        lastMatch.withLockedValue { $0 = found }
        await gradeFetch(run, location)
        await gradeSearchAnswer(run)
        run.record(Cases.beaconMatch, .pass, expected: Cases.beaconMatch.title,
                   actual: "beacon \(match.beaconIndex) matched \(configuration.peerKey.hexString(compressed: true).prefix(16))…")
        let now = DeliveryClock.nowMilliseconds
        let skew = configuration.clockSkewMilliseconds
        let ahead = Int64(bitPattern: match.expiration &- now)
        run.grade(Cases.expiration, holds: match.expiration + skew >= now && ahead <= 86_400_000 + Int64(skew),
                  expected: "now ≤ expiration ≤ now + 24 h", actual: "expiration \(ahead) ms ahead")

        let handshakeStarted = NIODeadline.now()
        let client: AuthenticatedSession.Client
        do {
            let context = try PSKTLSContext(role: .client)
            client = try await ClientBootstrap(group: group)
                .connectTimeout(configuration.stepTimeout)
                .connect(host: location.host, port: location.port) { channel in
                    AuthenticatedSession.configureClient(on: channel, context: context, identity: match.pskIdentity, psk: match.psk)
                }
            let parameters = try await client.handshake.get()
            let holds = parameters.protocolVersion == "TLSv1.2" && parameters.cipherSuite == PSKTLSProfile.cipherSuite
                && parameters.dhGroupBits >= PSKTLSProfile.minimumDHBits
            run.grade(Cases.handshake, holds: holds, expected: "TLSv1.2, \(PSKTLSProfile.cipherSuite), DH ≥ 2048 bits",
                      actual: "\(parameters.protocolVersion), \(parameters.cipherSuite), DH \(parameters.dhGroupBits) bits",
                      started: handshakeStarted)
        } catch {
            run.record(Cases.handshake, .fail, expected: "a PSK-TLS handshake with the beacon's identity and PSK",
                       actual: "\(error)", started: handshakeStarted)
            run.recordRemaining([Cases.closeNotify] + Cases.receiverRole, .inconclusive, because: "no PSK-TLS session")
            return
        }
        await gradeCloseNotify(run, location: location, match: match)
        await receive(run, over: client.session, queuedID: queuedID, limits: limits)
        try? await client.session.close().get()
    }

    /// A second session with the same beacon, ended by our close_notify while TCP stays open: the
    /// implementation answers with its own and closes within `closeNotifyTimeout` [PSK-6.4, NODE-1.21].
    private func gradeCloseNotify(_ run: ConformanceRun, location: BeaconLocation, match: BeaconMatch) async {
        let started = NIODeadline.now()
        let timeout = configuration.closeNotifyTimeout
        let outcome = await CloseNotifyProbe.run(host: location.host, port: location.port, identity: match.pskIdentity,
                                                 psk: match.psk, timeout: timeout, group: group)
        let verdict: ConformanceVerdict
        switch outcome {
        case .answered: verdict = .pass
        case .closedWithoutAnswer: verdict = .warn  // the session ended, but the peer learns nothing of a clean end
        case .stillOpen: verdict = .fail
        case .noSession: verdict = .inconclusive
        }
        run.record(Cases.closeNotify, verdict, expected: "its close_notify and the connection closed within \(Self.text(timeout))",
                   actual: outcome.description, started: started)
    }

    /// After the receiver role the implementation has nothing left for us: it withdraws the announcement
    /// it made for us with a byebye from its own address (ThaliSSDP reports `left(byebye)` only for a
    /// well-formed byebye of the tracked USN from the peer's address). Also grades that USN's form.
    private func gradeWithdrawal(_ run: ConformanceRun, events: AsyncStream<SSDPDiscoveryEvent>) async {
        guard let usn = usn.withLockedValue({ $0 }), let location = lastMatch.withLockedValue({ $0 })?.1 else {
            let why = configuration.location == nil ? "not found over SSDP" : "location given: SSDP not used to find it"
            run.record(Cases.usn, .notApplicable, expected: Cases.usn.title, actual: why)
            run.record(Cases.byebye, .notApplicable, expected: Cases.byebye.title, actual: why)
            return
        }
        let uuid = usn.hasPrefix("uuid:") ? UUID(uuidString: String(usn.dropFirst(5))) : nil
        run.grade(Cases.usn, holds: uuid != nil && usn == usn.lowercased(), expected: "uuid:<UUID> in lower case", actual: usn)
        let started = NIODeadline.now()
        let left = await withDeadline(configuration.stepTimeout) { () async -> SSDPDiscoveryEvent.DepartureReason? in
            for await event in events {
                if case .left(let peer, let reason) = event, peer.location == location, peer.uniqueServiceName == usn {
                    return reason
                }
            }
            return nil
        }
        run.grade(Cases.byebye, holds: left == .byebye, expected: "a byebye for \(usn) within \(Self.text(configuration.stepTimeout))",
                  actual: left.map { "left: \($0.rawValue)" } ?? "still announced", started: started)
    }

    /// While it announces itself for us, an M-SEARCH from a socket of ours is answered there: unicast to
    /// the searcher's address and port, with the headers of an answer (ThaliSSDP's strict parser).
    private func gradeSearchAnswer(_ run: ConformanceRun) async {
        guard let usn = usn.withLockedValue({ $0 }) else {
            run.record(Cases.searchAnswer, .notApplicable, expected: Cases.searchAnswer.title,
                       actual: "location given: SSDP not used to find it")
            return
        }
        let started = NIODeadline.now()
        let probe = SSDPSearchProbe(address: configuration.address, group: configuration.ssdpGroup, port: configuration.ssdpPort)
        let expected = "an answer for \(usn) within \(probe.maxWaitSeconds) s + \(Self.text(probe.slack))"
        do {
            let outcome = try await probe.search(expecting: usn, on: group)
            if let (answer, sender) = outcome.answer {
                run.grade(Cases.searchAnswer, holds: answer.searchTarget == ThaliServiceName.notificationType, expected: expected,
                          actual: "from \(sender): CACHE-CONTROL max-age=\(answer.maxAge), LOCATION \(answer.location.prefix(80)), "
                              + "ST \(answer.searchTarget.prefix(80)), USN \(answer.uniqueServiceName)", started: started)
            } else {
                let error = outcome.lastError.map { "; last malformed: \($0)" } ?? ""
                run.grade(Cases.searchAnswer, holds: false, expected: expected,
                          actual: "no answer for it (\(outcome.datagrams) datagrams\(error))", started: started)
            }
        } catch {
            run.record(Cases.searchAnswer, .inconclusive, expected: expected, actual: "cannot search: \(error)", started: started)
        }
    }

    /// Waits for SSDP to fetch an announcement from anyone that matches the peer's key.
    private func firstMatch(in fetched: AsyncStream<(SSDPPeer, [UInt8])>,
                            receiver: BeaconReceiver) async -> (BeaconMatch, BeaconLocation)? {
        let peerKey = configuration.peerKey
        let usn = self.usn
        return await withDeadline(configuration.discoveryTimeout) {
            for await (peer, bytes) in fetched {
                if let match = try? receiver.receive(bytes, from: peer.location.description), match.sender == peerKey {
                    usn.withLockedValue { $0 = peer.uniqueServiceName }
                    return (match, peer.location)
                }
            }
            return nil
        }
    }

    /// Fetches `location` until its announcement matches (it may not have announced the new item yet).
    private func poll(_ location: BeaconLocation, receiver: BeaconReceiver) async -> (BeaconMatch, BeaconLocation)? {
        var client = BeaconHTTPClientConfiguration()
        client.maxAttempts = 1
        let http = BeaconHTTPClient(configuration: client, group: group)
        let peerKey = configuration.peerKey
        return await withDeadline(configuration.discoveryTimeout) {
            while !Task.isCancelled {
                if let bytes = try? await http.fetch(location), !bytes.isEmpty,
                   let match = try? receiver.receive(bytes, from: location.description), match.sender == peerKey {
                    return (match, location)
                }
                try? await Task.sleep(nanoseconds: 500_000_000)
            }
            return nil
        }
    }

    private func gradeFetch(_ run: ConformanceRun, _ location: BeaconLocation) async {
        let started = NIODeadline.now()
        var client = BeaconHTTPClientConfiguration()
        client.maxAttempts = 1
        do {
            let bytes = try await BeaconHTTPClient(configuration: client, group: group).fetch(location)
            run.record(Cases.beaconFetch, .pass, expected: Cases.beaconFetch.title, actual: "200, \(bytes.count) bytes", started: started)
        } catch {
            run.record(Cases.beaconFetch, .fail, expected: Cases.beaconFetch.title, actual: "\(error)", started: started)
        }
    }

    /// Opens the delivery stream and plays the receiver, grading each step of the sender.
    private func receive(_ run: ConformanceRun, over session: MultiplexerSession, queuedID: UUID?, limits: DeliveryLimits) async {
        let started = NIODeadline.now()
        let frames: DeliveryChannel.AsyncFrames
        do {
            frames = try await DeliveryChannel.openStream(on: session, limits: limits)
        } catch {
            run.record(Cases.openStream, .fail, expected: Cases.openStream.title, actual: "opening failed: \(error)", started: started)
            run.recordRemaining(Cases.receiverRole, .inconclusive, because: "no stream")
            return
        }
        var script = ReceiverScript(queuedID: queuedID, maxItemBytes: configuration.maxItemBytes,
                                    skew: configuration.clockSkewMilliseconds)
        do {
            try await frames.executeThenClose { inbound, outbound in
                for try await frame in inbound {
                    let (answer, finished) = script.handle(frame, run)
                    if let answer { try await outbound.write(answer) }
                    if finished { return }
                }
            }
        } catch {
            script.ended(by: "\(error)", run)
        }
        script.ended(by: "the stream ended", run)
    }

    // MARK: Sender role: we deliver an item to it

    private func senderRole(_ run: ConformanceRun, server: PeerSuiteServer, discovery: SSDPDiscoveryService,
                            limits: DeliveryLimits) async {
        let configuration = self.configuration
        let announcement: BeaconAnnouncement
        do {
            announcement = try BeaconGenerator(identity: configuration.identity, profile: configuration.profile)
                .makeAnnouncement(for: [configuration.peerKey], validity: .seconds(600))
        } catch {
            run.recordRemaining(Cases.senderRole, .inconclusive, because: "cannot make an announcement: \(error)")
            return
        }
        server.serve(announcement)
        await discovery.advertise(announcement.stream)
        defer { server.serve(nil) }

        let content = Array("thali-conformance sender test \(UUID().uuidString)".utf8)
        let now = DeliveryClock.nowMilliseconds
        let offer = ItemOffer(id: UUID(), kind: .text, size: UInt64(content.count), sha256: Array(SHA256.hash(data: content)),
                              createdMilliseconds: now, expiresMilliseconds: now + 600_000, name: "")
        let lastFailure = NIOLockedValueBox<String?>(nil)
        let frames = await withDeadline(configuration.discoveryTimeout) { () async -> DeliveryChannel.AsyncFrames? in
            for await event in server.events {
                switch event {
                case .authenticated:
                    run.recordRemaining([Cases.senderConnects], .pass, because: "authenticated with our beacon's PSK")
                case .handshakeFailed(let reason):
                    lastFailure.withLockedValue { $0 = reason }
                case .stream(let frames):
                    return frames
                }
            }
            return nil
        }
        await discovery.advertise(nil)
        if let request = server.beaconRequests.first {
            Self.gradeBeaconRequest(run, request, host: BeaconLocation(host: configuration.address, port: server.port).hostHeader)
        }
        guard let frames else {
            let failure = lastFailure.withLockedValue { $0 }.map { "; last handshake: \($0)" } ?? ""
            run.recordRemaining(Cases.senderRole, .fail,
                                because: "no delivery stream from it within \(Self.text(configuration.discoveryTimeout))\(failure)")
            return
        }
        run.recordRemaining([Cases.senderConnects], .pass, because: "it opened a stream, so it authenticated")
        let streamStarted = NIODeadline.now()
        var acknowledged = false
        var unwanted: [UUID] = []  // items it must not keep: the expired one and the damaged one
        do {
            try await frames.executeThenClose { inbound, outbound in
                // The probe speaks version 2 (no progress frames, no batches), which later peers still serve.
                try await outbound.write(.hello(version: probeDeliveryVersion))
                var iterator = inbound.makeAsyncIterator()
                let welcome = try await iterator.next()
                guard case .welcome(let version, let maximum, _)? = welcome else {
                    run.record(Cases.senderWelcome, .fail, expected: "welcome", actual: welcome?.name ?? "the stream ended", started: streamStarted)
                    return
                }
                run.grade(Cases.senderWelcome, holds: version == probeDeliveryVersion && maximum >= DeliveryLimits.minimumFramePayloadBytes,
                          expected: "welcome(2, ≥ \(DeliveryLimits.minimumFramePayloadBytes))", actual: "welcome(\(version), \(maximum))",
                          started: streamStarted)
                try await outbound.write(.offer(offer))
                guard let answer = try await iterator.next() else {
                    run.record(Cases.senderStream, .fail, expected: "an answer to our offer", actual: "the stream ended", started: streamStarted)
                    return
                }
                guard case .answer(let id, let what) = answer, id == offer.id else {
                    run.record(Cases.senderStream, .fail, expected: "answer(\(offer.id))", actual: answer.name, started: streamStarted)
                    return
                }
                run.record(Cases.senderStream, .pass, expected: Cases.senderStream.title, actual: "answer \(what)", started: streamStarted)
                let offset: UInt64
                switch what {
                case .nothing, .partial: offset = 0  // start(0) is always allowed
                case .complete:
                    run.record(Cases.senderAck, .fail, expected: "nothing (a new item)", actual: "complete for an item it cannot hold")
                    return
                case .refused(let reason):
                    run.record(Cases.senderAck, .fail, expected: "the item taken", actual: "refused \(reason)")
                    return
                }
                let ackStarted = NIODeadline.now()
                try await outbound.write(.start(id: offer.id, offset: offset))
                try await outbound.write(.data(ByteBuffer(bytes: content)))
                try await outbound.write(.end(id: offer.id))
                let reply = try await iterator.next()
                guard case .ack(let acked)? = reply, acked == offer.id else {
                    run.record(Cases.senderAck, .fail, expected: "ack(\(offer.id))", actual: reply?.name ?? "the stream ended", started: ackStarted)
                    return
                }
                acknowledged = true
                run.record(Cases.senderAck, .pass, expected: Cases.senderAck.title, actual: "ack", started: ackStarted)
                unwanted.append(try await offerExpired(run, content: content, inbound: &iterator, outbound: outbound))
                unwanted.append(try await sendDamaged(run, content: content, inbound: &iterator, outbound: outbound))
                let closeStarted = NIODeadline.now()
                try await outbound.write(.done)
                // The receiver closes the stream; spec/node.md allows an end of input or a multiplexer
                // reset (every item is settled by its ack). Only a frame, or nothing before the idle
                // timeout, breaks the rule.
                let after: String?
                do {
                    after = try await iterator.next().map { "a \($0.name) frame" }
                } catch let error as DeliveryIdleTimeout {
                    after = "still open: \(error)"
                } catch {
                    after = nil
                }
                run.grade(Cases.senderClose, holds: after == nil, expected: "the stream ends after done (end of input or reset)",
                          actual: after ?? "ended", started: closeStarted)
            }
        } catch {
            run.recordRemaining([Cases.senderStream, Cases.senderAck, Cases.refusesExpired, Cases.rejectsDamaged, Cases.senderClose],
                                .fail, because: "\(error)")
        }
        await checkInbox(run, offer: offer, text: String(decoding: content, as: UTF8.self), acknowledged: acknowledged,
                         unwanted: unwanted)
    }

    /// Offers an item that expired a minute ago: the receiver must refuse it (reason 3), not take it.
    private func offerExpired(_ run: ConformanceRun, content: [UInt8],
                              inbound: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                              outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>) async throws -> UUID {
        let started = NIODeadline.now()
        let now = DeliveryClock.nowMilliseconds
        let offer = ItemOffer(id: UUID(), kind: .text, size: UInt64(content.count), sha256: Array(SHA256.hash(data: content)),
                              createdMilliseconds: now - 120_000, expiresMilliseconds: now - 60_000, name: "")
        try await outbound.write(.offer(offer))
        let answer = try await inbound.next()
        let refused: Bool
        if case .answer(offer.id, .refused(.expired))? = answer { refused = true } else { refused = false }
        run.grade(Cases.refusesExpired, holds: refused, expected: "answer refused(expired)",
                  actual: answer.map(Self.describe) ?? "the stream ended", started: started)
        // Taken after all: finish it as the protocol says, so the session can go on.
        if case .answer(offer.id, .nothing)? = answer {
            try await outbound.write(.start(id: offer.id, offset: 0))
            try await outbound.write(.data(ByteBuffer(bytes: content)))
            try await outbound.write(.end(id: offer.id))
            _ = try await inbound.next()
        }
        return offer.id
    }

    /// Sends an item whose content does not match its offered SHA-256: the receiver must reject it.
    private func sendDamaged(_ run: ConformanceRun, content: [UInt8],
                             inbound: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                             outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>) async throws -> UUID {
        let started = NIODeadline.now()
        let now = DeliveryClock.nowMilliseconds
        let damaged = content.map { $0 ^ 0x20 }  // same size, other bytes
        let offer = ItemOffer(id: UUID(), kind: .text, size: UInt64(content.count), sha256: Array(SHA256.hash(data: content)),
                              createdMilliseconds: now, expiresMilliseconds: now + 600_000, name: "")
        try await outbound.write(.offer(offer))
        let answer = try await inbound.next()
        guard case .answer(offer.id, .nothing)? = answer else {
            run.record(Cases.rejectsDamaged, .inconclusive, expected: "answer nothing to a new item",
                       actual: answer.map(Self.describe) ?? "the stream ended", started: started)
            return offer.id
        }
        try await outbound.write(.start(id: offer.id, offset: 0))
        try await outbound.write(.data(ByteBuffer(bytes: damaged)))
        try await outbound.write(.end(id: offer.id))
        let reply = try await inbound.next()
        let rejected: Bool
        if case .reject(offer.id, .digestMismatch)? = reply { rejected = true } else { rejected = false }
        run.grade(Cases.rejectsDamaged, holds: rejected, expected: "reject(digest mismatch)",
                  actual: reply.map(Self.describe) ?? "the stream ended", started: started)
        return offer.id
    }

    /// A frame with what matters for grading (the answer or reason, not just the type).
    static func describe(_ frame: DeliveryFrame) -> String {
        switch frame {
        case .answer(_, let answer): "answer \(answer)"
        case .reject(_, let reason): "reject \(reason)"
        default: frame.name
        }
    }

    private func checkInbox(_ run: ConformanceRun, offer: ItemOffer, text: String, acknowledged: Bool,
                            unwanted: [UUID]) async {
        guard let adapter = configuration.adapter else {
            run.record(Cases.senderInbox, .notApplicable, expected: Cases.senderInbox.title, actual: "no adapter to read the inbox with")
            return
        }
        guard acknowledged else {
            run.record(Cases.senderInbox, .inconclusive, expected: Cases.senderInbox.title, actual: "the item was not acknowledged")
            return
        }
        let started = NIODeadline.now()
        do {
            let inbox = try await adapter.inbox()
            let ours = inbox.filter { UUID(uuidString: $0.id) == offer.id }
            let kept = inbox.filter { item in unwanted.contains { UUID(uuidString: item.id) == $0 } }.count
            let fromUs = ours.allSatisfy { (try? ContactKey.parse($0.fromPublicKey)) == configuration.identity.publicKey }
            run.grade(Cases.senderInbox, holds: ours.count == 1 && fromUs && ours.first?.text == text && kept == 0,
                      expected: "one item \(offer.id) from us with our text, not the expired or damaged one",
                      actual: "\(ours.count) item(s)" + (ours.first.map { ", text \($0.text == text ? "intact" : "differs"), sender \(fromUs ? "us" : "someone else")" } ?? "")
                        + (kept > 0 ? ", and \(kept) it should have refused or rejected" : ""),
                      started: started)
        } catch {
            run.record(Cases.senderInbox, .inconclusive, expected: Cases.senderInbox.title, actual: "\(error)", started: started)
        }
    }

    // MARK: Negative cases

    private func negativeCases(_ run: ConformanceRun, location: BeaconLocation, match: BeaconMatch?) async {
        let timeout = configuration.stepTimeout
        var started = NIODeadline.now()
        let first = await TLSHelloProbe.send(.thaliSuite, host: location.host, port: location.port, timeout: timeout, group: group)
        if case .serverHello(let flight) = first, let exchange = flight.keyExchange, flight.cipherSuite == PSKTLSProfile.cipherSuiteID {
            run.grade(Cases.dhSize, holds: exchange.primeBits >= PSKTLSProfile.minimumDHBits, expected: "a prime of at least 2048 bits",
                      actual: "\(exchange.primeBits) bits", started: started)
            run.grade(Cases.noHint, holds: exchange.identityHint.isEmpty, expected: "an empty psk_identity_hint",
                      actual: exchange.identityHint.isEmpty ? "empty" : "\(exchange.identityHint.count) bytes")
            run.grade(Cases.noCompression, holds: flight.compressionMethod == 0, expected: "compression method 0 (none)",
                      actual: "compression method \(flight.compressionMethod)")
            let ticket = flight.extensions.contains(0x0023)
            run.grade(Cases.noTickets, holds: !ticket, expected: "no session_ticket extension in the ServerHello",
                      actual: ticket ? "session_ticket extension sent" : "none")
            started = NIODeadline.now()
            let second = await TLSHelloProbe.send(.thaliSuite, host: location.host, port: location.port, timeout: timeout, group: group)
            if case .serverHello(let again) = second, let other = again.keyExchange {
                run.grade(Cases.dhFresh, holds: other.serverPublic != exchange.serverPublic, expected: "a different dh_Ys",
                          actual: other.serverPublic == exchange.serverPublic ? "the same dh_Ys twice" : "different", started: started)
            } else {
                run.record(Cases.dhFresh, .inconclusive, expected: "a second ServerKeyExchange", actual: second.description, started: started)
            }
        } else {
            for testCase in [Cases.dhSize, Cases.noHint, Cases.noCompression, Cases.noTickets, Cases.dhFresh] {
                run.record(testCase, .fail, expected: "ServerHello with 0x00AB and a DHE-PSK ServerKeyExchange",
                           actual: first.description, started: started)
            }
        }

        let randomIdentity = Data((0..<144).map { _ in UInt8.random(in: .min ... .max) }).base64EncodedString()
        await refusedHandshake(run, Cases.unknownIdentity, location: location, identity: randomIdentity,
                               expected: .unknownPSKIdentity, what: "a random identity")
        if let match {
            await refusedHandshake(run, Cases.wrongPSK, location: location, identity: match.pskIdentity,
                                   expected: .badRecordMAC, what: "its identity and a wrong PSK")
        } else {
            run.record(Cases.wrongPSK, .inconclusive, expected: Cases.wrongPSK.title, actual: "no identity of its own matched")
        }

        let refusals: [(ConformanceCase, TLSHelloProbe.Hello, UInt8)] = [(Cases.tls13, .tls13Only, 70),
                                                                         (Cases.otherSuites, .otherSuitesOnly, 40)]
        for (testCase, hello, alert) in refusals {
            started = NIODeadline.now()
            let outcome = await TLSHelloProbe.send(hello, host: location.host, port: location.port, timeout: timeout, group: group)
            let verdict: ConformanceVerdict
            switch outcome {
            case .alert(_, let code): verdict = code == alert ? .pass : .warn
            case .serverHello: verdict = .fail
            case .closed, .malformed: verdict = .warn
            case .timedOut, .connectFailed: verdict = .inconclusive
            }
            run.record(testCase, verdict, expected: "a fatal \(alertName(alert)) alert", actual: outcome.description, started: started)
        }
    }

    /// Connects with `identity` and a random PSK: PASS when the handshake fails with `expected`, WARN
    /// when it fails otherwise (the MUST is the failure, the alert a SHOULD), FAIL when it succeeds.
    private func refusedHandshake(_ run: ConformanceRun, _ testCase: ConformanceCase, location: BeaconLocation,
                                  identity: String, expected alert: TLSAlert, what: String) async {
        let started = NIODeadline.now()
        let expected = "a fatal \(alert) alert"
        do {
            let connection = try await PSKTLSClient.connect(host: location.host, port: location.port, identity: identity,
                                                            psk: (0..<16).map { _ in UInt8.random(in: .min ... .max) },
                                                            eventLoopGroup: group)
            try? await connection.executeThenClose { _, _ in }
            run.record(testCase, .fail, expected: expected, actual: "the handshake succeeded with \(what)", started: started)
        } catch let error as PSKTLSError {
            let verdict: ConformanceVerdict = error.reason == .alertReceived(alert) ? .pass : .warn
            run.record(testCase, verdict, expected: expected, actual: error.description, started: started)
        } catch {
            run.record(testCase, .warn, expected: expected, actual: "\(error)", started: started)
        }
    }

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

    /// Grades the first beacon request it sent us against the client's rules [SSDP-6.6, SSDP-6.8].
    static func gradeBeaconRequest(_ run: ConformanceRun, _ request: HTTPRequestHead, host: String) {
        let expected = "GET \(BeaconLocation.notificationBeaconsPath) HTTP/1.1, Host: \(host), Connection: close, Accept: application/octet-stream"
        let connection = request.headers[canonicalForm: "Connection"].map { $0.lowercased() }
        let accept = request.headers[canonicalForm: "Accept"].map { $0.split(separator: ";").first?.trimmingCharacters(in: .whitespaces).lowercased() }
        let holds = request.method == .GET && request.uri == BeaconLocation.notificationBeaconsPath && request.version == .http1_1
            && request.headers["Host"] == [host] && connection.contains("close") && accept.contains("application/octet-stream")
        let shown = ["Host", "Connection", "Accept"].map { name in
            "\(name): \(request.headers[name].joined(separator: ", ").prefix(80))"
        }
        run.grade(Cases.senderBeaconRequest, holds: holds, expected: expected,
                  actual: "\(request.method.rawValue) \(request.uri.prefix(80)) \(request.version), \(shown.joined(separator: ", "))")
    }

    static func text(_ amount: TimeAmount) -> String {
        let milliseconds = amount.nanoseconds / 1_000_000
        return milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }
}

/// The receiver side of the delivery protocol as a script that grades the sender frame by frame. It
/// answers `nothing` to every offer (or `tooLarge` above the bound) and acknowledges intact items.
struct ReceiverScript {
    let queuedID: UUID?
    let maxItemBytes: UInt64
    let skew: UInt64
    private var sawHello = false
    /// The frame maximum our welcome announced (nil: a version 1 sender, no welcome), and the largest
    /// data frame seen.
    private var announced: Int?
    private var largestData = 0
    private var frameMaximumFailed = false
    /// What our welcome announces: the smallest maximum a receiver may announce, so a sender that keeps
    /// within it keeps within any.
    static let announcedFrameMaximum = DeliveryLimits.minimumFramePayloadBytes
    private var offers: [ItemOffer] = []
    private var current: (offer: ItemOffer, hasher: SHA256, received: UInt64)?
    private var transferred = 0
    private var finished = false
    private let started = NIODeadline.now()

    init(queuedID: UUID?, maxItemBytes: UInt64, skew: UInt64) {
        self.queuedID = queuedID
        self.maxItemBytes = maxItemBytes
        self.skew = skew
    }

    typealias Cases = PeerConformance.Cases

    /// Handles one frame: what to answer, and whether the session is over.
    mutating func handle(_ frame: DeliveryFrame, _ run: ConformanceRun) -> (DeliveryFrame?, Bool) {
        if !sawHello {
            sawHello = true
            run.record(Cases.openStream, .pass, expected: Cases.openStream.title, actual: "stream accepted, first frame \(frame.name)", started: started)
            guard case .hello(let version) = frame else {
                return fail(Cases.hello, expected: "hello", actual: frame.name, run)
            }
            switch version {
            case probeDeliveryVersion...:
                // A later sender speaks version 2 when welcomed with it.
                run.record(Cases.hello, .pass, expected: "hello(2)", actual: "hello(\(version))")
                announced = Self.announcedFrameMaximum
                return (.welcome(version: probeDeliveryVersion, maxFramePayloadBytes: UInt32(Self.announcedFrameMaximum)), false)
            case DeliveryFrame.oldestAcceptedVersion:
                // Still accepted by receivers, but it cannot learn our frame maximum or hear our errors.
                run.record(Cases.hello, .warn, expected: "hello(2)", actual: "hello(1): a version 1 sender")
                run.record(Cases.frameMaximum, .notApplicable, expected: Cases.frameMaximum.title, actual: "a version 1 sender gets no welcome")
                return (nil, false)
            default:
                run.record(Cases.hello, .fail, expected: "hello(2)", actual: "hello(\(version))")
                return (nil, true)
            }
        }
        switch frame {
        case .offer(let offer):
            guard current == nil else { return fail(Cases.transfer, expected: "start, data or end", actual: "offer", run) }
            offers.append(offer)
            let now = DeliveryClock.nowMilliseconds
            var problems: [String] = []
            if offer.expiresMilliseconds <= offer.createdMilliseconds { problems.append("expires not after created") }
            if offer.createdMilliseconds > now + skew { problems.append("created \(offer.createdMilliseconds - now) ms in the future") }
            // Before 2001-09-09 (1e12 ms): a count of seconds, or another epoch, not Unix milliseconds.
            if offer.createdMilliseconds < 1_000_000_000_000 { problems.append("created \(offer.createdMilliseconds) is not Unix milliseconds") }
            if offer.kind == .text && !offer.name.isEmpty { problems.append("a text with a name") }
            if offers.count == 1 || !problems.isEmpty {
                run.grade(Cases.offer, holds: problems.isEmpty, expected: "a well-formed offer with created < expires in Unix ms",
                          actual: problems.isEmpty ? "\(offer.kind) of \(offer.size) bytes" : problems.joined(separator: "; "))
            }
            if offer.size > maxItemBytes { return (.answer(id: offer.id, .refused(.tooLarge)), false) }
            current = (offer, SHA256(), 0)
            return (.answer(id: offer.id, .nothing), false)
        case .start(let id, let offset):
            guard let current, current.offer.id == id, offset == 0 else {
                return fail(Cases.transfer, expected: "start(\(self.current?.offer.id.uuidString ?? "?"), 0)", actual: "start(\(id), \(offset))", run)
            }
            return (nil, false)
        case .data(let buffer):
            guard var item = current else { return fail(Cases.transfer, expected: "data after start", actual: "data", run) }
            item.received += UInt64(buffer.readableBytes)
            guard item.received <= item.offer.size else {
                return fail(Cases.transfer, expected: "\(item.offer.size) bytes", actual: "more than \(item.offer.size) bytes", run)
            }
            buffer.withUnsafeReadableBytes { item.hasher.update(bufferPointer: $0) }
            current = item
            largestData = max(largestData, buffer.readableBytes)
            if let announced, buffer.readableBytes > announced, !frameMaximumFailed {
                frameMaximumFailed = true
                run.record(Cases.frameMaximum, .fail, expected: "data frames of at most \(announced) bytes",
                           actual: "a data frame of \(buffer.readableBytes) bytes")
            }
            return (nil, false)
        case .end(let id):
            guard let item = current, item.offer.id == id else { return fail(Cases.transfer, expected: "end of the current item", actual: "end(\(id))", run) }
            current = nil
            let digest = Array(item.hasher.finalize())
            let intact = item.received == item.offer.size && digest == item.offer.sha256
            transferred += 1
            if transferred == 1, let announced, !frameMaximumFailed {
                run.record(Cases.frameMaximum, .pass, expected: "data frames of at most \(announced) bytes",
                           actual: "largest data frame \(largestData) bytes, item of \(item.offer.size)")
            }
            if transferred == 1 || !intact {
                run.grade(Cases.transfer, holds: intact, expected: "\(item.offer.size) bytes with the offered SHA-256",
                          actual: "\(item.received) bytes, digest \(digest == item.offer.sha256 ? "matches" : "differs")")
            }
            return (intact ? .ack(id: id) : .reject(id: id, .digestMismatch), false)
        case .done:
            guard current == nil else { return fail(Cases.done, expected: "end before done", actual: "done mid-item", run) }
            var problems: [String] = []
            if let queuedID, !offers.contains(where: { $0.id == queuedID }) { problems.append("the item queued through the adapter was not offered") }
            if offers.isEmpty { problems.append("nothing was offered") }
            run.grade(Cases.done, holds: problems.isEmpty, expected: "done after every queued item",
                      actual: problems.isEmpty ? "done after \(offers.count) item(s)" : problems.joined(separator: "; "))
            finished = true
            return (nil, true)
        default:
            return fail(Cases.transfer, expected: "a sender frame", actual: frame.name, run)
        }
    }

    /// The stream ended (or failed) before `done`: the steps not graded yet fail with `reason`.
    mutating func ended(by reason: String, _ run: ConformanceRun) {
        guard !finished else { return }
        finished = true
        run.recordRemaining(Cases.receiverRole, .fail, because: reason)
    }

    private mutating func fail(_ testCase: ConformanceCase, expected: String, actual: String, _ run: ConformanceRun) -> (DeliveryFrame?, Bool) {
        run.record(testCase, .fail, expected: expected, actual: actual)
        finished = true
        return (nil, true)
    }
}

/// The delivery protocol version the probe speaks, as sender and as receiver: 2, which every later peer
/// still serves (a version 3 receiver welcomes a `hello(2)` with 2; a version 3 sender welcomed with 2
/// speaks 2).
private let probeDeliveryVersion: UInt8 = 2
