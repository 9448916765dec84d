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
        /// `peer/ssdp/search-answer-delay`: searches sent at once are answered after delays drawn at random
        /// within min(MX, 5) s.
        public static let searchAnswerDelay = ConformanceCase("peer/ssdp/search-answer-delay",
                                                              "searches sent at once are answered after delays spread at random within min(MX, 5) s",
                                                              ["SSDP-4.3"])
        /// `peer/ssdp/byebye`: once nothing is left for us it withdraws its announcement with a byebye.
        public static let byebye = ConformanceCase("peer/ssdp/byebye", "once nothing is left for us it withdraws its announcement with a byebye",
                                                   ["SSDP-2.5", "SSDP-4.2", "NODE-3.1"])
        /// `peer/http/beacons`: GET /NotificationBeacons answers 200 with the beacon stream.
        public static let beaconFetch = ConformanceCase("peer/http/beacons", "GET /NotificationBeacons answers 200 with the beacon stream",
                                                        ["SSDP-6.2", "SSDP-6.5"])
        /// `peer/beacons/match`: its announcement has a beacon for us that matches.
        public static let beaconMatch = ConformanceCase("peer/beacons/match", "its announcement has a beacon for us that matches",
                                                        ["BCN-1.1", "BCN-2.1", "BCN-2.2", "BCN-2.3", "BCN-2.4", "BCN-2.5", "BCN-4.7", "NODE-3.1"])
        /// `peer/beacons/fresh-ephemeral-key`: the announcements it makes for us over the run (a new one
        /// for each item queued through the adapter) each carry another ephemeral key.
        public static let freshEphemeralKey = ConformanceCase("peer/beacons/fresh-ephemeral-key",
                                                              "every announcement of its that SSDP fetched over the run carries an ephemeral key of its own",
                                                              ["BCN-1.3"])
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
        /// `peer/delivery/hello`: the sender's first frame is hello, version 3 (an older version is a warning).
        public static let hello = ConformanceCase("peer/delivery/hello", "the sender's first frame is hello, version 3", ["NODE-1.1", "NODE-1.4"])
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
        /// `peer/delivery/progress-window`: after our welcome(3) with an 8 KiB window, its content beyond
        /// our last progress stays within the window, and it goes on after each report.
        public static let window = ConformanceCase("peer/delivery/progress-window",
                                                   "after our welcome(3) announces an 8 KiB progress window, its content beyond our last progress stays within it, and our reports let it go on",
                                                   ["NODE-1.28", "NODE-1.27"])
        /// `peer/delivery/item-batch`: texts that fit our frame maximum come whole as item frames, the
        /// last of a batch flagged, nothing else inside the batch.
        public static let itemBatch = ConformanceCase("peer/delivery/item-batch",
                                                      "texts that fit our frame maximum come whole as item frames, intact, the last of the batch flagged and nothing else inside it",
                                                      ["NODE-1.29"])
        /// `peer/delivery/version-2-fallback`: welcomed with version 2 on a second stream, it speaks
        /// version 2: a text goes by offer, not as an item frame, and it needs no progress.
        public static let version2Fallback = ConformanceCase("peer/delivery/version-2-fallback",
                                                             "welcomed with version 2 on a second stream, it speaks version 2: its text goes by offer, not as an item frame, with no progress awaited",
                                                             ["NODE-1.26"])
        /// `peer/delivery/done`: after our acks the sender sends done.
        public static let done = ConformanceCase("peer/delivery/done", "after our acks the sender sends done", ["NODE-1.12", "NODE-1.13"])
        /// `peer/sender/connects`: it fetches our beacons and connects with our PSK.
        public static let senderConnects = ConformanceCase("peer/sender/connects", "it fetches our beacons and connects with our PSK",
                                                           ["SSDP-3.6", "NODE-3.2", "NODE-3.3", "PSK-3.1"])
        /// `peer/sender/beacon-request`: its beacon fetch is GET /NotificationBeacons HTTP/1.1, Host host:port, Connection: close, Accept: application/octet-stream.
        public static let senderBeaconRequest = ConformanceCase("peer/sender/beacon-request",
                                                                "its beacon fetch is GET /NotificationBeacons HTTP/1.1, Host host:port, Connection: close, Accept: application/octet-stream",
                                                                ["SSDP-6.6", "SSDP-6.8"])
        /// `peer/sender/welcome`: it answers our hello (version 4) with welcome: version 3 or 4, its frame
        /// maximum (at least 1024) and its progress window (at least 2048); an older version is a warning.
        public static let senderWelcome = ConformanceCase("peer/sender/welcome",
                                                          "it answers our hello(4) with welcome: version 3 or 4, its frame maximum, at least 1024, and its progress window, at least 2048",
                                                          ["NODE-1.22", "NODE-1.26"])
        /// `peer/sender/opens-stream`: it opens a delivery stream and answers our offer.
        public static let senderStream = ConformanceCase("peer/sender/opens-stream", "it opens a delivery stream and answers our offer",
                                                         ["NODE-1.19", "NODE-1.3", "MUX-1.1"])
        /// `peer/sender/ack`: it acknowledges the item after end.
        public static let senderAck = ConformanceCase("peer/sender/ack", "it acknowledges the item after end", ["NODE-1.10"])
        /// `peer/sender/progress`: before its ack it reports progress of the item, each report larger than
        /// the last, none beyond what we sent, the last the whole item.
        public static let senderProgress = ConformanceCase("peer/sender/progress",
                                                           "before its ack it reports progress, each report larger than the last and within what we sent, the last the whole item",
                                                           ["NODE-1.27"])
        /// `peer/sender/item-batch`: a batch of three texts as item frames, the middle one damaged, is
        /// answered in order after the flagged one: ack, reject, ack.
        public static let senderBatch = ConformanceCase("peer/sender/item-batch",
                                                        "a batch of three texts as item frames, the middle one damaged, is answered in order after the flagged one: ack, reject, ack",
                                                        ["NODE-1.29", "NODE-1.11"])
        /// `peer/sender/refuses-expired`: an item already expired is refused (reason 3).
        public static let refusesExpired = ConformanceCase("peer/sender/refuses-expired", "an item already expired is refused (reason 3)",
                                                           ["NODE-1.16", "NODE-1.20"])
        /// `peer/sender/rejects-damaged`: content that misses its SHA-256 gets reject.
        public static let rejectsDamaged = ConformanceCase("peer/sender/rejects-damaged", "content that misses its SHA-256 gets reject",
                                                           ["NODE-1.11"])
        /// `peer/sender/closes-after-done`: it closes the stream after done.
        public static let senderClose = ConformanceCase("peer/sender/closes-after-done", "it closes the stream after done", ["NODE-1.13"])
        /// `peer/sender/inbox`: the items it acknowledged are in its inbox once, from us, intact; the expired
        /// and the damaged ones are not.
        public static let senderInbox = ConformanceCase("peer/sender/inbox",
                                                        "the items it acknowledged are in its inbox once, from us, intact; the expired and damaged ones are not",
                                                        ["NODE-1.15", "NODE-3.4"])
        /// `peer/psk-tls/no-identity-hint`: the ServerKeyExchange carries no identity hint.
        public static let noHint = ConformanceCase("peer/psk-tls/no-identity-hint", "the ServerKeyExchange carries no identity hint", ["PSK-1.6"])
        /// `peer/psk-tls/unknown-identity`: an unknown identity gets unknown_psk_identity.
        public static let unknownIdentity = ConformanceCase("peer/psk-tls/unknown-identity", "an unknown identity gets unknown_psk_identity",
                                                            ["PSK-4.1", "PSK-4.2"])
        /// `peer/psk-tls/wrong-psk`: its own identity with a wrong PSK fails the handshake.
        public static let wrongPSK = ConformanceCase("peer/psk-tls/wrong-psk", "its own identity with a wrong PSK fails the handshake",
                                                     ["PSK-4.3"])
        /// `peer/psk-tls/renegotiation-refused`: a ClientHello we send inside an established session
        /// gets no_renegotiation, never a second handshake.
        public static let renegotiationRefused = ConformanceCase("peer/psk-tls/renegotiation-refused",
                                                                 "a ClientHello we send inside an established session gets no_renegotiation, never a second handshake",
                                                                 ["PSK-1.5"])
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

        /// `peer/yamux/ping-answered`: a raw Ping with SYN is answered with ACK and the same value.
        public static let pingAnswered = ConformanceCase("peer/yamux/ping-answered", "a Ping with SYN is answered by a Ping with ACK and the same opaque value",
                                                         ["MUX-2.3"])
        /// `peer/yamux/data-after-fin`: data on a stream after our FIN resets that stream, and only it.
        public static let dataAfterFIN = ConformanceCase("peer/yamux/data-after-fin",
                                                         "data on a stream after our FIN resets that stream (RST), and the session goes on",
                                                         ["MUX-2.10", "MUX-2.8"])
        /// `peer/yamux/reset-stream`: after our RST, and data on the reset stream, the session goes on.
        public static let resetStream = ConformanceCase("peer/yamux/reset-stream",
                                                        "after our RST on an open stream, and a late data frame on it (dropped), the session goes on: no GoAway, a Ping answered",
                                                        ["MUX-2.9"])
        /// `peer/yamux/wrong-parity`: a stream we open with the server's parity ends the session with GoAway 1.
        public static let wrongParity = ConformanceCase("peer/yamux/wrong-parity",
                                                        "a stream opened by the client with an even id ends the session with GoAway code 1 (protocol error)",
                                                        ["MUX-2.5", "MUX-2.4", "MUX-2.15"])
        /// `peer/yamux/window-overrun`: a data frame beyond the 256 KiB window ends the session with GoAway 1.
        public static let windowOverrun = ConformanceCase("peer/yamux/window-overrun",
                                                          "a data frame of 256 KiB + 1 on a new stream, beyond its window, ends the session with GoAway code 1",
                                                          ["MUX-2.12", "MUX-2.15"])

        /// `peer/yamux/goaway-normal`: after our GoAway 0 its open stream goes on and the session answers
        /// a Ping; after our GoAway 2 it ends the session.
        public static let goAwayNormal = ConformanceCase("peer/yamux/goaway-normal",
                                                         "after our GoAway 0 the stream it serves is not reset and a Ping is answered; after our GoAway 2 it ends the session",
                                                         ["MUX-2.14"])

        /// Every case of peer mode.
        public static let all = [discovered, beaconFetch, beaconMatch, expiration, freshEphemeralKey, handshake, closeNotify, openStream, hello, offer,
                                 transfer, frameMaximum, window, itemBatch, done, version2Fallback] + answers + [usn, searchAnswer, searchAnswerDelay, multicastTTL, ownAlivesDropped, byebye,
                                 senderConnects, senderBeaconRequest, senderWelcome, senderStream, senderProgress, senderAck, refusesExpired,
                                 rejectsDamaged, senderBatch, senderClose, senderInbox,
                                 uncleanCloseReported, noHint, noCompression, noTickets, unknownIdentity, wrongPSK, renegotiationRefused, tls13, otherSuites, dhSize, dhFresh,
                                 pingAnswered, dataAfterFIN, resetStream, wrongParity, windowOverrun, goAwayNormal,
                                 unmarkedServed, alpnSelected, unknownKindRefused, badHeaderRefused, appNotServed, deliveryAccepted,
                                 sendWindowRespected]
        static let rawMultiplexer = [pingAnswered, dataAfterFIN, resetStream, wrongParity, windowOverrun, goAwayNormal]
        static let receiverRole = [openStream, hello, offer, transfer, frameMaximum, window, itemBatch, done]
        static let senderRole = [senderConnects, senderBeaconRequest, senderWelcome, senderStream, senderProgress, senderAck, refusesExpired,
                                 rejectsDamaged, senderBatch, senderClose, senderInbox]
    }

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
        await roles(run, server: server, discovery: discovery, fetched: fetched, queuedIDs: queuedIDs, events: events)
    }

    /// Both delivery roles, then (with SSDP stopped and the suite's port closed) the cases on the
    /// implementation's port: negative TLS, raw multiplexer, marking. Without `discovery` (over Bluetooth)
    /// the implementation is at ``PeerConformanceConfiguration/location`` and finds the suite there too.
    /// `events` are the implementation's own reports, through the adapter.
    func roles(_ run: ConformanceRun, server: PeerSuiteServer, discovery: SSDPDiscoveryService?,
               fetched: AsyncStream<(SSDPPeer, [UInt8])>, queuedIDs: [UUID], events: AdapterEventFollower?) async {
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
            gradeOwnAlivesDropped(run, events: events, own: location, suite: suiteLocation)
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
        run.recordRemaining(Cases.all, .inconclusive, because: Task.isCancelled ? "interrupted" : "an earlier step failed")
    }

    /// Every announcement SSDP fetched, for BCN-1.3.
    private let announcements: NIOLockedValueBox<AnnouncementKeyLog>

    /// The announcements fetched from its location over the run, once SSDP has stopped [BCN-1.3]. One
    /// announcement is N/A: a node makes a new one for a new item, and a run that queued nothing (no
    /// adapter) may see just one.
    private func gradeEphemeralKeys(_ run: ConformanceRun, location: BeaconLocation?) {
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
    private let usn = NIOLockedValueBox<String?>(nil)

    /// The beacon match of the receiver role and where it was found (the negative cases use both).
    private let lastMatch = NIOLockedValueBox<(BeaconMatch, BeaconLocation)?>(nil)

    // MARK: Receiver role: it has an item for us

    private func receiverRole(_ run: ConformanceRun, fetched: AsyncStream<(SSDPPeer, [UInt8])>, queuedIDs: [UUID],
                              limits: DeliveryLimits) async {
        let configuration = self.configuration
        let receiver = BeaconReceiver(identity: configuration.identity, profile: configuration.profile)
        do { try receiver.addressBook.add(configuration.peerKey) } catch {}
        let started = NIODeadline.now()
        let found: (BeaconMatch, BeaconLocation)?
        if let location = configuration.location {
            run.record(Cases.discovered, .notApplicable, expected: Cases.discovered.title,
                       actual: configuration.bluetooth == nil ? "location given: \(location)" : "\(Self.overBluetooth), reached at \(location)")
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
            run.recordRemaining([Cases.beaconFetch, Cases.beaconMatch, Cases.expiration, Cases.handshake, Cases.closeNotify, Cases.version2Fallback]
                                + Cases.receiverRole,
                                .inconclusive, because: "no beacon for us found")
            return
        }
        let (match, location) = found
        lastMatch.withLockedValue { $0 = found }
        await gradeFetch(run, location)
        await gradeSearchAnswer(run)
        await gradeMulticastTTL(run, location: location)
        run.record(Cases.beaconMatch, .pass, expected: Cases.beaconMatch.title,
                   actual: "beacon \(match.beaconIndex) matched \(configuration.peerKey.hexString(compressed: true).prefix(16))…")
        let now = DeliveryClock.nowMilliseconds
        let skew = configuration.clockSkewMilliseconds
        let ahead = Int64(bitPattern: match.expiration &- now)
        run.grade(Cases.expiration, holds: match.expiration + skew >= now && ahead <= 86_400_000 + Int64(skew),
                  expected: "now ≤ expiration ≤ now + 24 h", actual: "expiration \(ahead) ms ahead")

        let handshakeStarted = NIODeadline.now()
        let client: AuthenticatedSession.Client
        let negotiated: String?
        do {
            let context = try PSKTLSContext(role: .client)
            client = try await ClientBootstrap(group: group)
                .connectTimeout(configuration.stepTimeout)
                .connect(host: location.host, port: location.port) { channel in
                    AuthenticatedSession.configureClient(on: channel, context: context, identity: match.pskIdentity, psk: match.psk)
                }
            let parameters = try await client.handshake.get()
            negotiated = parameters.applicationProtocol
            let holds = parameters.protocolVersion == "TLSv1.2" && parameters.cipherSuite == PSKTLSProfile.cipherSuite
                && parameters.dhGroupBits >= PSKTLSProfile.minimumDHBits
            run.grade(Cases.handshake, holds: holds, expected: "TLSv1.2, \(PSKTLSProfile.cipherSuite), DH ≥ 2048 bits",
                      actual: "\(parameters.protocolVersion), \(parameters.cipherSuite), DH \(parameters.dhGroupBits) bits",
                      started: handshakeStarted)
        } catch {
            run.record(Cases.handshake, .fail, expected: "a PSK-TLS handshake with the beacon's identity and PSK",
                       actual: "\(error)", started: handshakeStarted)
            run.recordRemaining([Cases.closeNotify, Cases.version2Fallback] + Cases.receiverRole, .inconclusive, because: "no PSK-TLS session")
            return
        }
        await gradeCloseNotify(run, location: location, match: match)
        await receive(run, over: client.session, queuedIDs: queuedIDs, limits: limits)
        gradeUnmarked(run, negotiated: negotiated)
        await gradeVersion2Fallback(run, over: client.session, limits: limits, announcedFrom: location, fetched: fetched)
        await gradeAnswers(run, over: client.session, limits: limits)
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
    private func gradeWithdrawal(_ run: ConformanceRun, events: AsyncStream<SSDPDiscoveryEvent>?) async {
        guard let events, let usn = usn.withLockedValue({ $0 }), let location = lastMatch.withLockedValue({ $0 })?.1 else {
            let why = configuration.location == nil ? "not found over SSDP" : ssdpNotUsed
            run.record(Cases.usn, .notApplicable, expected: Cases.usn.title, actual: why)
            run.record(Cases.byebye, .notApplicable, expected: Cases.byebye.title, actual: why)
            return
        }
        let uuid = usn.hasPrefix("uuid:") ? UUID(uuidString: String(usn.dropFirst(5))) : nil
        run.grade(Cases.usn, holds: uuid != nil && usn == usn.lowercased(), expected: "uuid:<UUID> in lower case", actual: usn)
        let started = NIODeadline.now()
        let left = await withDeadline(configuration.stepTimeout) { () async -> SSDPDiscoveryEvent.DepartureReason? in
            // While it still had items for us it may have announced anew under another USN (new items
            // make new beacons): its withdrawal is then that USN's byebye.
            var tracked = usn
            for await event in events {
                switch event {
                case .changed(let peer, let previous) where peer.location == location && previous == tracked:
                    tracked = peer.uniqueServiceName
                case .left(let peer, let reason) where peer.location == location && peer.uniqueServiceName == tracked:
                    return reason
                default:
                    break
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
            for testCase in [Cases.searchAnswer, Cases.searchAnswerDelay] {
                run.record(testCase, .notApplicable, expected: testCase.title, actual: ssdpNotUsed)
            }
            return
        }
        let started = NIODeadline.now()
        var probe = SSDPSearchProbe(address: configuration.address, group: configuration.ssdpGroup, port: configuration.ssdpPort)
        probe.searches = configuration.searchesAtOnce
        let expected = "an answer for \(usn) within \(probe.maxWaitSeconds) s + \(Self.text(probe.slack))"
        let delays = SearchAnswerDelays(maxWaitSeconds: probe.maxWaitSeconds, sent: probe.searches, tolerance: configuration.searchDelayTolerance)
        let expectedDelays = "\(probe.searches) answers within \(probe.maxWaitSeconds) s, spread over more than \(Self.text(SearchAnswerDelays.minimumSpread))"
        defer { run.recordRemaining([Cases.searchAnswerDelay], .inconclusive, because: "no search made") }
        do {
            let location = lastMatch.withLockedValue { $0 }?.1.description
            let outcome = try await probe.search(expecting: usn, orLocation: location, on: group)
            let (verdict, seen) = delays.judge(outcome.answerDelays)
            run.record(Cases.searchAnswerDelay, verdict, expected: expectedDelays, actual: seen, started: started)
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
        let announcements = self.announcements
        return await withDeadline(configuration.discoveryTimeout) {
            while !Task.isCancelled {
                if let bytes = try? await http.fetch(location), !bytes.isEmpty {
                    announcements.withLockedValue { $0.record(bytes, from: location) }
                    if let match = try? receiver.receive(bytes, from: location.description), match.sender == peerKey {
                        return (match, location)
                    }
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
    private func receive(_ run: ConformanceRun, over session: MultiplexerSession, queuedIDs: [UUID], limits: DeliveryLimits) async {
        let started = NIODeadline.now()
        let frames: DeliveryChannel.AsyncFrames
        do {
            frames = try await DeliveryChannel.openStream(on: session, limits: limits, dataDelivery: .wholeFrames)
        } catch {
            run.record(Cases.openStream, .fail, expected: Cases.openStream.title, actual: "opening failed: \(error)", started: started)
            run.recordRemaining(Cases.receiverRole, .inconclusive, because: "no stream")
            return
        }
        var script = ReceiverScript(queuedIDs: queuedIDs, maxItemBytes: configuration.maxItemBytes,
                                    skew: configuration.clockSkewMilliseconds)
        await converse(frames, &script, run)
        script.ended(by: "the stream ended", run)
    }

    /// A second delivery stream, welcomed with version 2: a version 3 sender speaks version 2 on it
    /// [NODE-1.26]. A fresh text is queued for it first (the first stream took the others); its steps are
    /// graded apart and summed up in one case.
    private func gradeVersion2Fallback(_ run: ConformanceRun, over session: MultiplexerSession, limits: DeliveryLimits,
                                       announcedFrom location: BeaconLocation, fetched: AsyncStream<(SSDPPeer, [UInt8])>) async {
        let testCase = Cases.version2Fallback
        let started = NIODeadline.now()
        guard let hello = run.report.results.first(where: { $0.testCase == Cases.hello }), hello.verdict == .pass else {
            run.record(testCase, .notApplicable, expected: testCase.title, actual: "the sender does not speak version 3")
            return
        }
        var queued: [UUID] = []
        if let adapter = configuration.adapter {
            do {
                // Longer than our frame maximum: without a window to bound its chunks, only the maximum does.
                queued.append(try await adapter.send(text: "thali-conformance version 2 text \(UUID().uuidString) \(Self.filler)",
                                                     to: configuration.nameAtPeer))
            } catch {
                run.record(testCase, .inconclusive, expected: testCase.title, actual: "adapter: \(error)", started: started)
                return
            }
            await awaitSecondAnnouncement(from: location, in: fetched)
        }
        // The stream is scripted apart: its own verdicts are summed up in this one case.
        let scratch = ConformanceRun(target: "version 2 stream", catalog: nil)
        var script = ReceiverScript(queuedIDs: queued, maxItemBytes: configuration.maxItemBytes,
                                    skew: configuration.clockSkewMilliseconds, welcomeVersion: probeDeliveryVersion2)
        // The first stream's sender session may not have released its claim yet (one sending session per
        // contact): it then closes the new stream before its hello, and a later stream is served.
        for _ in 0..<Self.fallbackStreamAttempts {
            guard let frames = try? await DeliveryChannel.openStream(on: session, limits: limits, dataDelivery: .wholeFrames) else { break }
            await converse(frames, &script, scratch)
            if !scratch.report.results.isEmpty { break }
        }
        script.ended(by: "the stream ended", scratch)
        let wrong = scratch.report.results.filter { ![.pass, .notApplicable].contains($0.verdict) }
        guard !queued.isEmpty || !wrong.isEmpty else {
            run.record(testCase, .inconclusive, expected: testCase.title, actual: "no adapter: nothing queued to see how it is sent", started: started)
            return
        }
        let actual = wrong.isEmpty
            ? "\(script.offeredIDs.count) item(s) by offer, \(script.itemFrames) item frame(s), done"
            : wrong.map { "\($0.testCase.id.split(separator: "/").last ?? ""): \($0.actual)" }.joined(separator: "; ")
        run.grade(testCase, holds: wrong.isEmpty && script.itemFrames == 0, expected: "welcome(2) answered in version 2: offer, start, data, end, done",
                  actual: actual, started: started)
    }

    /// Waits, up to `announcementWait`, for SSDP to fetch a second announcement of its from `location`
    /// unless it has one already: the item just queued is new, and a node announces anew for it.
    private func awaitSecondAnnouncement(from location: BeaconLocation, in fetched: AsyncStream<(SSDPPeer, [UInt8])>) async {
        let announcements = self.announcements
        guard announcements.withLockedValue({ $0.count(location) }) < 2 else { return }
        guard configuration.bluetooth == nil else {
            // No SSDP to fetch it for us: fetch it over the link until it changes.
            var client = BeaconHTTPClientConfiguration()
            client.maxAttempts = 1
            let http = BeaconHTTPClient(configuration: client, group: group)
            _ = await withDeadline(configuration.announcementWait) { () async -> Bool? in
                while !Task.isCancelled {
                    if let bytes = try? await http.fetch(location) {
                        let count = announcements.withLockedValue { log in
                            log.record(bytes, from: location)
                            return log.count(location)
                        }
                        if count >= 2 { return true }
                    }
                    try? await Task.sleep(nanoseconds: 250_000_000)
                }
                return nil
            }
            return
        }
        _ = await withDeadline(configuration.announcementWait) { () async -> Bool? in
            for await _ in fetched where announcements.withLockedValue({ $0.count(location) }) >= 2 { return true }
            return nil
        }
    }

    /// The bulk of the long texts queued for us: 12 KiB, more than our frame maximum and our progress window.
    static let filler = String(repeating: "0123456789abcdef", count: 768)

    /// How often the version 2 stream is opened again when it closes before its first frame.
    static let fallbackStreamAttempts = 3

    /// Plays `script` on `frames` until it finishes or the stream ends. In version 3 a report of progress
    /// goes out only once the sender has sent nothing for ``PeerConformanceConfiguration/windowQuietPeriod``.
    func converse(_ frames: DeliveryChannel.AsyncFrames, _ script: inout ReceiverScript, _ run: ConformanceRun) async {
        enum Input: Sendable {
            case frame(DeliveryFrame)
            case quiet(generation: Int)
        }
        let quietPeriod = configuration.windowQuietPeriod
        let eventLoop = frames.channel.eventLoop
        do {
            try await frames.executeThenClose { inbound, outbound in
                let (inputs, sink) = AsyncThrowingStream.makeStream(of: Input.self)
                try await withThrowingTaskGroup(of: Void.self) { tasks in
                    tasks.addTask {
                        do {
                            for try await frame in inbound { sink.yield(.frame(frame)) }
                            sink.finish()
                        } catch {
                            sink.finish(throwing: error)
                        }
                    }
                    defer { tasks.cancelAll() }
                    var generation = 0
                    var pending: Scheduled<Void>?
                    for try await input in inputs {
                        switch input {
                        case .frame(let frame):
                            generation += 1
                            pending?.cancel()
                            let step = script.handle(frame, run)
                            try await outbound.write(contentsOf: step.replies)
                            if step.finished { return }
                            if step.awaitsProgress {
                                let current = generation
                                pending = eventLoop.scheduleTask(in: quietPeriod) { sink.yield(.quiet(generation: current)) }
                            }
                        case .quiet(let quiet) where quiet == generation:
                            if let report = script.quiet() { try await outbound.write(report) }
                        case .quiet:
                            break
                        }
                    }
                }
            }
        } catch {
            script.ended(by: "\(error)", run)
        }
    }

    // MARK: Sender role: we deliver an item to it

    private func senderRole(_ run: ConformanceRun, server: PeerSuiteServer, discovery: SSDPDiscoveryService?,
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
        // Over Bluetooth nothing is announced: the implementation fetches the suite's port over the link
        // (after the `00` hello, and again while the link lasts).
        server.serve(announcement)
        await discovery?.advertise(announcement.stream)
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
                case .beaconsFetched, .wake, .markedStream, .refusedStreamEnded, .sessionEnded:
                    break
                }
            }
            return nil
        }
        await discovery?.advertise(nil)
        if let request = server.beaconRequests.first {
            // Over the link it fetched a local port of its own, which the suite cannot know.
            let host = configuration.bluetooth == nil ? BeaconLocation(host: configuration.address, port: server.port).hostHeader : nil
            Self.gradeBeaconRequest(run, request, host: host)
        }
        guard let frames else {
            let failure = lastFailure.withLockedValue { $0 }.map { "; last handshake: \($0)" } ?? ""
            run.recordRemaining(Cases.senderRole, .fail,
                                because: "no delivery stream from it within \(Self.text(configuration.discoveryTimeout))\(failure)")
            return
        }
        run.recordRemaining([Cases.senderConnects], .pass, because: "it opened a stream, so it authenticated")
        let streamStarted = NIODeadline.now()
        var delivered: [(id: UUID, text: String)] = []
        var unwanted: [UUID] = []  // items it must not keep: the expired one and the damaged ones
        do {
            try await frames.executeThenClose { inbound, outbound in
                try await outbound.write(.hello(version: DeliveryFrame.protocolVersion))
                var iterator = inbound.makeAsyncIterator()
                let welcome = try await iterator.next()
                guard case .welcome(let version, let maximum, let window)? = welcome else {
                    run.record(Cases.senderWelcome, .fail, expected: "welcome", actual: welcome?.name ?? "the stream ended", started: streamStarted)
                    return
                }
                let speaksProgress = Self.gradeWelcome(run, version: version, maximum: maximum, window: window, started: streamStarted)
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
                try await outbound.write(contentsOf: [.start(id: offer.id, offset: offset), .data(ByteBuffer(bytes: content)), .end(id: offer.id)])
                let (reply, reports) = try await Self.settle(&iterator)
                if speaksProgress { Self.gradeProgress(run, reports, of: offer, sent: UInt64(content.count), started: ackStarted) }
                guard case .ack(let acked)? = reply, acked == offer.id else {
                    run.record(Cases.senderAck, .fail, expected: "ack(\(offer.id))", actual: reply?.name ?? "the stream ended", started: ackStarted)
                    return
                }
                delivered.append((offer.id, String(decoding: content, as: UTF8.self)))
                run.record(Cases.senderAck, .pass, expected: Cases.senderAck.title, actual: "ack", started: ackStarted)
                unwanted.append(try await offerExpired(run, content: content, inbound: &iterator, outbound: outbound))
                unwanted.append(try await sendDamaged(run, content: content, inbound: &iterator, outbound: outbound))
                if speaksProgress {
                    let (intact, damaged) = try await sendBatch(run, inbound: &iterator, outbound: outbound)
                    delivered += intact
                    unwanted.append(damaged)
                }
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
            run.recordRemaining([Cases.senderStream, Cases.senderProgress, Cases.senderAck, Cases.refusesExpired, Cases.rejectsDamaged,
                                 Cases.senderBatch, Cases.senderClose],
                                .fail, because: "\(error)")
        }
        await checkInbox(run, delivered: delivered, unwanted: unwanted)
    }

    /// Grades its welcome to our hello(4) and returns whether it speaks version 3 (or 4, whose welcome has
    /// the same fields; a version 3 receiver rightly answers with 3). A version 2 welcome is
    /// what an older receiver rightly answers: a warning, and its version 3 cases do not apply.
    private static func gradeWelcome(_ run: ConformanceRun, version: UInt8, maximum: UInt32, window: UInt32?, started: NIODeadline) -> Bool {
        let speaksProgress = version >= DeliveryFrame.progressVersion
        let minimumWindow = 2 * DeliveryLimits.minimumFramePayloadBytes
        let wellFormed = (probeDeliveryVersion2...DeliveryFrame.protocolVersion).contains(version)
            && maximum >= DeliveryLimits.minimumFramePayloadBytes
            && (speaksProgress ? window.map { $0 >= minimumWindow } ?? false : window == nil)
        let verdict: ConformanceVerdict = !wellFormed ? .fail : speaksProgress ? .pass : .warn
        run.record(Cases.senderWelcome, verdict,
                   expected: "welcome(\(DeliveryFrame.progressVersion) or \(DeliveryFrame.protocolVersion), ≥ \(DeliveryLimits.minimumFramePayloadBytes), ≥ \(minimumWindow))",
                   actual: "welcome(\(version), \(maximum)\(window.map { ", \($0)" } ?? ""))" + (speaksProgress ? "" : ": an older receiver"),
                   started: started)
        if !speaksProgress {
            for testCase in [Cases.senderProgress, Cases.senderBatch] {
                run.record(testCase, .notApplicable, expected: testCase.title, actual: "a version \(version) receiver")
            }
        }
        return speaksProgress && wellFormed
    }

    /// Reads the receiver's next frame that is not `progress`, and the progress reports before it.
    private static func settle(_ inbound: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator) async throws
        -> (DeliveryFrame?, [(id: UUID, bytes: UInt64)]) {
        var reports: [(id: UUID, bytes: UInt64)] = []
        while let frame = try await inbound.next() {
            guard case .progress(let id, let bytes) = frame else { return (frame, reports) }
            // Bounded by the item: a receiver reporting without end is a failure, not a hang.
            guard reports.count < maxProgressReports else { return (frame, reports) }
            reports.append((id, bytes))
        }
        return (nil, reports)
    }

    /// The most progress reports read for one item before its answer (ours are a few dozen bytes: one
    /// or two reports).
    static let maxProgressReports = 1024

    /// Grades the progress a version 3 receiver reported for `offer` before answering it [NODE-1.27].
    private static func gradeProgress(_ run: ConformanceRun, _ reports: [(id: UUID, bytes: UInt64)], of offer: ItemOffer, sent: UInt64,
                                      started: NIODeadline) {
        var problems: [String] = []
        if reports.isEmpty { problems.append("no progress report") }
        if reports.contains(where: { $0.id != offer.id }) { problems.append("a report for another item") }
        if zip(reports, reports.dropFirst()).contains(where: { $0.bytes >= $1.bytes }) { problems.append("a report not larger than the last") }
        if let most = reports.map(\.bytes).max(), most > sent { problems.append("\(most) bytes reported of \(sent) sent") }
        if let last = reports.last, last.bytes != offer.size { problems.append("the last report says \(last.bytes) of \(offer.size)") }
        run.grade(Cases.senderProgress, holds: problems.isEmpty, expected: "progress reports rising to \(offer.size), then the ack",
                  actual: problems.isEmpty ? "\(reports.count) report(s): \(reports.map { String($0.bytes) }.joined(separator: ", "))"
                      : problems.joined(separator: "; "),
                  started: started)
    }

    /// Sends three texts as one batch of item frames, the middle one's content damaged: a version 3
    /// receiver answers after the flagged one, in order: ack, reject(digest mismatch), ack [NODE-1.29].
    /// Returns the intact ones it acknowledged and the damaged one's id.
    private func sendBatch(_ run: ConformanceRun, inbound: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                           outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>) async throws -> ([(id: UUID, text: String)], UUID) {
        let started = NIODeadline.now()
        let now = DeliveryClock.nowMilliseconds
        let texts = (1...3).map { "thali-conformance batch item \($0) \(UUID().uuidString)" }
        let offers = texts.map { text in
            ItemOffer(id: UUID(), kind: .text, size: UInt64(text.utf8.count), sha256: Array(SHA256.hash(data: Array(text.utf8))),
                      createdMilliseconds: now, expiresMilliseconds: now + 600_000, name: "")
        }
        let damagedIndex = 1
        try await outbound.write(contentsOf: offers.indices.map { index in
            let bytes = Array(texts[index].utf8)
            return .item(offers[index], content: ByteBuffer(bytes: index == damagedIndex ? bytes.map { $0 ^ 0x20 } : bytes),
                         endsBatch: index == offers.count - 1)
        })
        let expected: [DeliveryFrame] = offers.indices.map { index in
            index == damagedIndex ? .reject(id: offers[index].id, .digestMismatch) : .ack(id: offers[index].id)
        }
        var answers: [DeliveryFrame] = []
        while answers.count < expected.count, let frame = try await inbound.next() {
            answers.append(frame)
        }
        let holds = answers == expected
        run.grade(Cases.senderBatch, holds: holds, expected: "ack, reject digest mismatch, ack, for the items in order",
                  actual: answers.isEmpty ? "the stream ended" : answers.map { frame in
                      let index = offers.firstIndex { offer in [.ack(id: offer.id), .reject(id: offer.id, .digestMismatch)].contains(frame) }
                      return Self.describe(frame) + (index.map { " (item \($0 + 1))" } ?? "")
                  }.joined(separator: ", "),
                  started: started)
        let acknowledged = offers.indices.filter { answers.contains(.ack(id: offers[$0].id)) && $0 != damagedIndex }
        return (acknowledged.map { (offers[$0].id, texts[$0]) }, offers[damagedIndex].id)
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
            try await outbound.write(contentsOf: [.start(id: offer.id, offset: 0), .data(ByteBuffer(bytes: content)), .end(id: offer.id)])
            _ = try await Self.settle(&inbound)
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
        try await outbound.write(contentsOf: [.start(id: offer.id, offset: 0), .data(ByteBuffer(bytes: damaged)), .end(id: offer.id)])
        let (reply, _) = try await Self.settle(&inbound)
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

    private func checkInbox(_ run: ConformanceRun, delivered: [(id: UUID, text: String)], unwanted: [UUID]) async {
        guard let adapter = configuration.adapter else {
            run.record(Cases.senderInbox, .notApplicable, expected: Cases.senderInbox.title, actual: "no adapter to read the inbox with")
            return
        }
        guard !delivered.isEmpty else {
            run.record(Cases.senderInbox, .inconclusive, expected: Cases.senderInbox.title, actual: "no item was acknowledged")
            return
        }
        let started = NIODeadline.now()
        do {
            let inbox = try await adapter.inbox()
            var problems: [String] = []
            for (index, item) in delivered.enumerated() {
                let ours = inbox.filter { UUID(uuidString: $0.id) == item.id }
                let fromUs = ours.allSatisfy { (try? ContactKey.parse($0.fromPublicKey)) == configuration.identity.publicKey }
                if ours.count != 1 { problems.append("item \(index + 1): \(ours.count) copies") }
                if !fromUs { problems.append("item \(index + 1): from someone else") }
                if let text = ours.first?.text, text != item.text { problems.append("item \(index + 1): text differs") }
            }
            let kept = inbox.filter { item in unwanted.contains { UUID(uuidString: item.id) == $0 } }.count
            if kept > 0 { problems.append("\(kept) it should have refused or rejected") }
            run.grade(Cases.senderInbox, holds: problems.isEmpty,
                      expected: "the \(delivered.count) acknowledged item(s) once each, from us, intact; not the \(unwanted.count) unwanted",
                      actual: problems.isEmpty ? "\(delivered.count) item(s) intact, none unwanted" : problems.joined(separator: "; "),
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
            started = NIODeadline.now()
            let answer = await RenegotiationProbe.run(host: location.host, port: location.port, identity: match.pskIdentity,
                                                      psk: match.psk, timeout: configuration.renegotiationTimeout, group: group)
            run.record(Cases.renegotiationRefused, answer.verdict, expected: "a no_renegotiation alert, no second handshake",
                       actual: answer.description, started: started)
        } else {
            for testCase in [Cases.wrongPSK, Cases.renegotiationRefused] {
                run.record(testCase, .inconclusive, expected: testCase.title, actual: "no identity of its own matched")
            }
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

    // MARK: Raw multiplexer cases

    /// Yamux written by hand inside sessions to `target` (keyed by its beacon for a Thali node, plain TCP
    /// for a bare yamux server): four connections, the first kept alive
    /// through a ping, a stream with data after FIN and a reset stream; the second told GoAway 0, then 2;
    /// the other two each ended by a protocol error (a stream of the wrong parity, a window overrun).
    func gradeRawMultiplexer(_ run: ConformanceRun, against target: RawYamuxTarget) async {
        let timeout = configuration.stepTimeout
        var started = NIODeadline.now()
        do {
            try await target.session(group: group) { session in
                let (answer, answered) = try await Self.ping(&session, value: 0xC0FF_EE01, timeout: timeout)
                run.grade(Cases.pingAnswered, holds: answered, expected: "Ping ACK stream 0 length \(0xC0FF_EE01)", actual: answer.summary,
                          started: started)
                started = NIODeadline.now()
                try await session.send([(YamuxHeader(type: .windowUpdate, flags: .syn, streamID: 1, length: 0), 0),
                                        (YamuxHeader(type: .windowUpdate, flags: .fin, streamID: 1, length: 0), 0),
                                        (YamuxHeader(type: .data, streamID: 1, length: 4), 4)])
                let (reset, _) = try await session.waitFor(within: timeout) { $0.streamID == 1 && $0.flags.contains(.rst) || $0.type == .goAway }
                let (_, held) = try await Self.ping(&session, value: 0xC0FF_EE02, timeout: timeout)
                var holds = false
                if case .frame(let header) = reset, header.type != .goAway { holds = held }
                run.grade(Cases.dataAfterFIN, holds: holds, expected: "RST on stream 1, then a Ping still answered",
                          actual: "\(reset.summary)\(held ? ", then the Ping answered" : ", then no Ping answer")", started: started)
                started = NIODeadline.now()
                try await session.send([(YamuxHeader(type: .windowUpdate, flags: .syn, streamID: 3, length: 0), 0),
                                        (YamuxHeader(type: .windowUpdate, flags: .rst, streamID: 3, length: 0), 0),
                                        (YamuxHeader(type: .data, streamID: 3, length: 4), 4),
                                        (YamuxHeader(type: .ping, flags: .syn, streamID: 0, length: 0xC0FF_EE03), 0)])
                let (last, before) = try await session.waitFor(within: timeout) { $0.type == .goAway || $0.type == .ping && $0.flags.contains(.ack) }
                var goesOn = false
                if case .frame(let header) = last { goesOn = header.type == .ping && header.length == 0xC0FF_EE03 }
                run.grade(Cases.resetStream, holds: goesOn, expected: "no GoAway; the Ping after them answered",
                          actual: last.summary + (before.isEmpty ? "" : " after \(before.map(\.summary).joined(separator: ", "))"), started: started)
            }
        } catch {
            run.recordRemaining([Cases.pingAnswered, Cases.dataAfterFIN, Cases.resetStream], .inconclusive, because: "no session: \(error)")
        }
        await gradeGoAway(run, against: target)
        // The wrong parity is a header alone. The overrun's header goes first, alone too: an implementation
        // that judges it from the header ends the session before any payload is sent (payload still
        // unread when it closes would make its kernel reset the connection, and drop its GoAway on our
        // side); one that waits for the bytes gets them after a quiet period, and a GoAway then is a
        // WARN (it read past its window first).
        let overrun = YamuxHeader.initialWindowSize + 1
        let endings: [(ConformanceCase, [(YamuxHeader, payload: Int)], payload: Int)] = [
            (Cases.wrongParity, [(YamuxHeader(type: .windowUpdate, flags: .syn, streamID: 2, length: 0), 0)], 0),
            (Cases.windowOverrun, [(YamuxHeader(type: .data, flags: .syn, streamID: 1, length: UInt32(overrun)), 0)], overrun),
        ]
        for (testCase, frames, payload) in endings {
            started = NIODeadline.now()
            do {
                try await target.session(group: group) { session in
                    try await session.send(frames)
                    var (ending, _) = try await session.waitFor(within: payload > 0 ? configuration.windowQuietPeriod : timeout) { $0.type == .goAway }
                    var afterPayload = ""
                    if payload > 0, ending == .timedOut {
                        try await session.sendPayload(payload)
                        (ending, _) = try await session.waitFor(within: timeout) { $0.type == .goAway }
                        afterPayload = " (after the payload)"
                    }
                    let verdict: ConformanceVerdict
                    switch ending {
                    // Refused, but only once the bytes beyond the window came: the header alone said it.
                    case .frame(let header) where !afterPayload.isEmpty: verdict = header.isGoAway(.protocolError) ? .warn : .fail
                    case .frame(let header): verdict = header.isGoAway(.protocolError) ? .pass : .fail
                    case .ended where !afterPayload.isEmpty: verdict = .inconclusive  // a reset may have dropped its GoAway
                    default: verdict = .fail
                    }
                    run.record(testCase, verdict, expected: "GoAway code 1 (protocol error)", actual: ending.summary + afterPayload, started: started)
                }
            } catch {
                run.record(testCase, .inconclusive, expected: testCase.title, actual: "no session: \(error)", started: started)
            }
        }
    }

    /// A stream we open (its first frame from the implementation shows it is served; one reset at once is
    /// followed by another, up to ``fallbackStreamAttempts``), then our GoAway 0:
    /// the stream must not be reset and a Ping must still be answered; then our GoAway 2 (internal error)
    /// must end the session [MUX-2.14].
    private func gradeGoAway(_ run: ConformanceRun, against target: RawYamuxTarget) async {
        let (timeout, started) = (configuration.stepTimeout, NIODeadline.now())
        let greeting = target.servedStreamGreeting
        do {
            try await target.session(group: group) { session in
                // A Thali node serves one delivery sender per contact at a time: a stream opened while the
                // sender of an earlier session still holds the contact is closed at once (reset). The next
                // stream, opened after that, is served.
                var served: (id: UInt32, first: RawYamuxSession.Input)?
                var refused: [String] = []
                for id in stride(from: UInt32(1), through: UInt32(2 * Self.fallbackStreamAttempts - 1), by: 2) where served == nil {
                    try await session.send([greeting > 0 ? (YamuxHeader(type: .data, flags: .syn, streamID: id, length: UInt32(greeting)), greeting)
                                                         : (YamuxHeader(type: .windowUpdate, flags: .syn, streamID: id, length: 0), 0)])
                    let (first, _) = try await session.waitFor(within: timeout) { $0.streamID == id && ($0.type == .data || $0.flags.contains(.rst)) }
                    if case .frame(let header) = first, header.flags.contains(.rst) {
                        refused.append(first.summary)
                    } else {
                        served = (id, first)
                    }
                }
                guard let served, case .frame(let header) = served.first, header.type == .data else {
                    run.record(Cases.goAwayNormal, .inconclusive, expected: "a data frame on a stream we opened",
                               actual: (refused + [served?.first.summary].compactMap { $0 }).joined(separator: "; "), started: started)
                    return
                }
                let id = served.id
                try await session.send([(YamuxHeader(type: .goAway, streamID: 0, length: YamuxHeader.GoAwayCode.normal.rawValue), 0),
                                        (YamuxHeader(type: .ping, flags: .syn, streamID: 0, length: 0xC0FF_EE04), 0)])
                let (answer, before) = try await session.waitFor(within: timeout) {
                    $0.type == .goAway || $0.type == .ping && $0.flags.contains(.ack) || $0.streamID == id && $0.flags.contains(.rst)
                }
                var goesOn = false
                if case .frame(let header) = answer { goesOn = header.type == .ping && header.length == 0xC0FF_EE04 }
                try await session.send([(YamuxHeader(type: .goAway, streamID: 0, length: YamuxHeader.GoAwayCode.internalError.rawValue), 0)])
                let (ending, _) = try await session.waitFor(within: timeout) { _ in false }
                var ended = false
                if case .ended = ending { ended = true }
                run.grade(Cases.goAwayNormal, holds: goesOn && ended,
                          expected: "after GoAway 0: no RST on stream \(id), no GoAway, the Ping answered; after GoAway 2: the connection ends",
                          actual: "after GoAway 0: \(answer.summary)" + (before.isEmpty ? "" : " after \(before.map(\.summary).joined(separator: ", "))")
                              + "; after GoAway 2: \(ending.summary)", started: started)
            }
        } catch {
            run.record(Cases.goAwayNormal, .inconclusive, expected: Cases.goAwayNormal.title, actual: "no session: \(error)", started: started)
        }
    }

    /// Sends a Ping with SYN and `value`: the answer (or what came instead) and whether it is the Ping
    /// with ACK and the same value.
    private static func ping(_ session: inout RawYamuxSession, value: UInt32, timeout: TimeAmount) async throws -> (RawYamuxSession.Input, Bool) {
        try await session.send([(YamuxHeader(type: .ping, flags: .syn, streamID: 0, length: value), 0)])
        let (answer, _) = try await session.waitFor(within: timeout) { $0.type == .ping && $0.flags.contains(.ack) || $0.type == .goAway }
        if case .frame(let header) = answer { return (answer, header.type == .ping && header.length == value) }
        return (answer, false)
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
