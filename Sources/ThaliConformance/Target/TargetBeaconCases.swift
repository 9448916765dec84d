import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP
import ThaliSupport

extension TargetConformance {
    /// Announcements for the implementation from a contact, served on a port that also speaks PSK-TLS: a
    /// tampered one (no connection may follow), a good one (a session must), then the good one again from
    /// the same location under a new USN (a replay: no connection may follow).
    func beaconCases(_ run: ConformanceRun, announcer: Announcer) async throws {
        guard let (peer, identity) = configuration.keys else {
            for testCase in Cases.beacons {
                run.record(testCase, .notApplicable, expected: testCase.title, actual: "no keys (--peer-key and --identity)")
            }
            return
        }
        let server = try await PeerSuiteServer.start(host: configuration.address, peer: peer, limits: DeliveryLimits(), group: group)
        var watch = ServerWatch(server: server)
        do {
            let generator = BeaconGenerator(identity: identity)
            let good = try generator.makeAnnouncement(for: [peer], validity: .seconds(600))
            let other = try generator.makeAnnouncement(for: [peer], validity: .seconds(600))
            var flipped = other.stream
            flipped[other.profile.preambleLength + BeaconWire.flagLength - 1] ^= 0x01  // the last byte of its beacon's flag (the GCM tag)
            let tampered = BeaconAnnouncement(profile: other.profile, stream: flipped, expiration: other.expiration, beacons: other.beacons)
            var started = NIODeadline.now()
            server.serve(tampered)
            try await announcer.announce(server.port, { server.fetchCount })
            let tamperedSeen = try await watch.observe(for: configuration.observation)
            server.serve(try Self.strangerFirst(for: peer, identity: identity))
            try await announcer.announce(server.port, { server.fetchCount })
            let strangerSeen = try await watch.observe(for: configuration.observation)
            started = NIODeadline.now()
            server.serve(good)
            try await announcer.announce(server.port, { server.fetchCount })
            let connected = try await watch.untilSession(within: configuration.observation)
            run.grade(Cases.matchConnects, holds: connected.session,
                      expected: "a fetch, then a PSK-TLS session without ALPN and a delivery stream on it", actual: connected.description,
                      started: started)
            guard connected.session else {
                run.recordDependents([Cases.welcome, Cases.tamperedNoConnect, Cases.strangerFirstNoConnect, Cases.closeNotifyFirst,
                                      Cases.replayNoConnect, Cases.smallGroupRefused, Cases.statusChecked] + Cases.marking, on: Cases.matchConnects)
                await server.close()
                return
            }
            // The rules of the session's delivery, apart from the beacon rules that led to it.
            run.grade(Cases.welcome, holds: connected.welcomed, expected: "welcome to our hello(\(DeliveryFrame.protocolVersion))",
                      actual: connected.welcome.map { "no welcome: \($0)" } ?? "welcome", started: started)
            try await gradeClosing(run, connected: connected, watch: &watch)
            for (testCase, seen) in [(Cases.tamperedNoConnect, tamperedSeen), (Cases.strangerFirstNoConnect, strangerSeen)] {
                run.grade(testCase, holds: seen.fetches > 0 && seen.connections == 0,
                          expected: "a fetch and no connection within \(PeerConformance.text(configuration.observation))", actual: seen.description)
            }
            started = NIODeadline.now()
            if announcer.replayWait == nil { try await announcer.announce(server.port, { server.fetchCount }) }
            let replayPeriod = announcer.replayWait ?? configuration.observation
            let replayed = try await watch.observe(for: replayPeriod)
            let expected = (announcer.replayWait == nil ? "" : "over the same link, ")
                + "a fetch and no connection within \(PeerConformance.text(replayPeriod))"
            if replayed.fetches == 0 {
                run.record(Cases.replayNoConnect, .inconclusive, expected: expected, actual: replayed.description, started: started)
            } else {
                run.grade(Cases.replayNoConnect, holds: replayed.connections == 0, expected: expected, actual: replayed.description, started: started)
            }
            if try await marking(run, server: server, watch: &watch, generator: generator, peer: peer, announcer: announcer) {
                try await refusal(run, server: server, watch: &watch, announcement: try generator.makeAnnouncement(for: [peer], validity: .seconds(600)),
                                  announcer: announcer)
            }
        } catch {
            await server.close()
            throw error
        }
        await server.close()
        try await smallGroup(run, announcer: announcer, peer: peer, identity: identity)
        try await statusChecked(run, announcer: announcer, peer: peer, identity: identity)
    }

    /// Two good announcements for it, one answered `404 Not Found`, one `200` with `Content-Type:
    /// text/html`: a client takes only 200 with application/octet-stream, or 204 [SSDP-6.6], so neither
    /// leads to a connection (one that ignores the status would match the beacon and connect).
    func statusChecked(_ run: ConformanceRun, announcer: Announcer, peer: PublicKey, identity: PrivateKey) async throws {
        let started = NIODeadline.now()
        let generator = BeaconGenerator(identity: identity)
        var locations: [(String, ScriptedLocation)] = []
        defer { for (_, location) in locations { location.close() } }
        for (what, status, type) in [("404", "404 Not Found", "application/octet-stream"), ("200 text/html", "200 OK", "text/html")] {
            let body = try generator.makeAnnouncement(for: [peer], validity: .seconds(600)).stream
            locations.append((what, try await ScriptedLocation.start(host: configuration.address, body: body, status: status,
                                                                       contentType: type, group: group)))
        }
        for (_, location) in locations { try await announcer.announce(location.port, { location.fetches }) }
        try await Task.sleep(for: .nanoseconds(configuration.observation.nanoseconds))
        let expected = "each fetched, and no connection to either"
        let seen = locations.map { what, location in "\(what): \(location.fetches) fetch(es), \(location.otherConnections) connection(s)" }
        guard locations.allSatisfy({ $0.1.fetches > 0 }) else {
            run.record(Cases.statusChecked, .inconclusive, expected: expected, actual: seen.joined(separator: "; "), started: started)
            return
        }
        run.grade(Cases.statusChecked, holds: locations.allSatisfy { $0.1.otherConnections == 0 }, expected: expected,
                  actual: seen.joined(separator: "; "), started: started)
    }

    /// How the session of match-connects ended, waiting up to an observation period for its end: its
    /// close_notify first passes, a bare TCP close fails [PSK-6.1]; a session still open, or one we
    /// closed first, says nothing of how it closes.
    func gradeClosing(_ run: ConformanceRun, connected: ServerWatch.Seen, watch: inout ServerWatch) async throws {
        let started = NIODeadline.now()
        let ended = connected.ended.isEmpty ? try await watch.untilSessionEnds(within: configuration.observation).ended : connected.ended
        let expected = "its close_notify, then the TCP close"
        guard let end = ended.first else {
            run.record(Cases.closeNotifyFirst, .inconclusive, expected: expected,
                       actual: "the session was still open \(PeerConformance.text(configuration.observation)) after delivery ended", started: started)
            return
        }
        switch end {
        case .closeNotify, .bareClose:
            run.grade(Cases.closeNotifyFirst, holds: end == .closeNotify, expected: expected, actual: end.description, started: started)
        case .closedBySuite, .failed:
            run.record(Cases.closeNotifyFirst, .inconclusive, expected: expected, actual: end.description, started: started)
        }
    }

    /// Our server now selects `thali-streams/1` (the sessions before were unmarked): a new announcement
    /// for it, and the header of the delivery stream it opens on the new session, and whether it read our
    /// status. Returns whether its sessions are marked (else the marking cases are UNSUPPORTED).
    func marking(_ run: ConformanceRun, server: PeerSuiteServer, watch: inout ServerWatch, generator: BeaconGenerator,
                         peer: PublicKey, announcer: Announcer) async throws -> Bool {
        server.mark(.acceptDelivery)
        server.serve(try generator.makeAnnouncement(for: [peer], validity: .seconds(600)))
        try await announcer.announce(server.port, { server.fetchCount })
        let connected = try await watch.untilSession(within: configuration.observation)
        guard connected.session else {
            run.recordRemaining(Cases.marking, .inconclusive, because: "a new announcement led to no session: \(connected)")
            return false
        }
        guard connected.markedSessions > 0 else {
            run.recordRemaining(Cases.marking, .unsupported, because: "it offered no \(StreamHeader.alpnProtocol): its sessions are unmarked")
            return false
        }
        guard let (header, status) = connected.headers.first else {
            run.recordRemaining(Cases.marking, .fail, because: "a marked session, and no marked stream: \(connected)")
            return false
        }
        run.grade(Cases.deliveryHeader, holds: header == .kind(.delivery), expected: "header delivery (08 64 65 6c 69 76 65 72 79)",
                  actual: header.description)
        let welcomed = status == .accepted && connected.welcomed
        run.grade(Cases.statusRead, holds: welcomed, expected: "after our status 0 and hello, its welcome",
                  actual: status != .accepted ? "we refused its stream: \(status)" : welcomed ? "welcome" : "no welcome: the stream failed or ended")
        return true
    }

    /// A new announcement for it, and every marked stream of its sessions refused (not-served): each is
    /// closed by it, none opened again on its session, and the sessions over ``TargetConformanceConfiguration/observation``
    /// stay within ``TargetConformanceConfiguration/maxConnectionsAfterRefusal`` [NODE-4.7].
    func refusal(_ run: ConformanceRun, server: PeerSuiteServer, watch: inout ServerWatch, announcement: BeaconAnnouncement,
                         announcer: Announcer) async throws {
        let started = NIODeadline.now()
        server.mark(.refuse(StreamRefusal(.notServed, reason: "refused on purpose by the conformance suite")))
        server.serve(announcement)
        try await announcer.announce(server.port, { server.fetchCount })
        let seen = try await watch.observe(for: configuration.observation)
        let expected = "the refused streams closed by it, at most one per session, at most \(configuration.maxConnectionsAfterRefusal) connections "
            + "within \(PeerConformance.text(configuration.observation))"
        guard seen.refused > 0 else {
            run.record(Cases.refusalNotRetried, .inconclusive, expected: expected, actual: seen.description, started: started)
            return
        }
        run.grade(Cases.refusalNotRetried, holds: seen.refusedEnded + 1 >= seen.refused && seen.refused <= seen.markedSessions
                    && seen.connections <= configuration.maxConnectionsAfterRefusal,
                  expected: expected, actual: seen.description, started: started)
    }

    /// A good announcement for it on a location whose TLS side offers a 1536-bit group: the client must
    /// refuse it at the ServerKeyExchange [PSK-2.3]. The server's flight is written by hand (no TLS
    /// library would offer the group); nothing after it is needed, since a conforming client stops there.
    func smallGroup(_ run: ConformanceRun, announcer: Announcer, peer: PublicKey, identity: PrivateKey) async throws {
        let started = NIODeadline.now()
        let announcement = try BeaconGenerator(identity: identity).makeAnnouncement(for: [peer], validity: .seconds(600))
        let location = try await ScriptedLocation.start(host: configuration.address, body: announcement.stream,
                                                        tlsFlight: SmallGroupFlight.bytes(), group: group)
        defer { location.close() }
        try await announcer.announce(location.port, { location.fetches })
        try await Task.sleep(for: .nanoseconds(configuration.observation.nanoseconds))
        let replies = location.tlsReplies
        let expected = "a fatal handshake_failure alert after our ServerKeyExchange"
        guard let first = replies.first else {
            run.record(Cases.smallGroupRefused, .inconclusive, expected: expected,
                       actual: "\(location.fetches) fetch(es), no TLS connection", started: started)
            return
        }
        let verdict: ConformanceVerdict
        switch first {
        case .alert(2, 40): verdict = .pass
        case .alert, .closed: verdict = .warn  // refused, but not with the specified alert
        case .continued: verdict = .fail
        }
        run.record(Cases.smallGroupRefused, verdict, expected: expected,
                   actual: "\(replies.count) connection(s): " + replies.map(\.description).reduce(into: [String]()) { kinds, reply in
                       if !kinds.contains(reply) { kinds.append(reply) }
                   }.joined(separator: "; "), started: started)
    }
}

/// The server's first flight offering a 1536-bit DH group (RFC 3526 group 5) for TLS_DHE_PSK_WITH_AES_256_GCM_SHA384:
/// ServerHello (with an empty renegotiation_info, which OpenSSL clients require), ServerKeyExchange (an
/// empty identity hint, p, g = 2, a Ys), ServerHelloDone, in one record.
enum SmallGroupFlight {
    static let prime: [UInt8] = {
        // A constant of 384 hex digits: decoding it cannot fail (`TargetModeTests` grades the flight it
        // makes); an empty prime would make the case FAIL, never pass.
        Hex.decode("""
            FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD\
            EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED\
            EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F\
            83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA237327FFFFFFFFFFFFFFFF
            """) ?? []
    }()

    static func bytes() -> [UInt8] {
        func vector16(_ bytes: [UInt8]) -> [UInt8] { [UInt8(bytes.count >> 8), UInt8(bytes.count & 0xFF)] + bytes }
        func handshake(_ type: UInt8, _ body: [UInt8]) -> [UInt8] {
            [type, 0, UInt8(body.count >> 8), UInt8(body.count & 0xFF)] + body
        }
        let random = (0..<32).map { _ in UInt8.random(in: .min ... .max) }
        let extensions: [UInt8] = [0xFF, 0x01, 0x00, 0x01, 0x00]
        let hello = [0x03, 0x03] + random + [0x00, 0x00, 0xAB, 0x00] + vector16(extensions)
        // Ys = 4, a square, so in the prime-order subgroup that OpenSSL checks before the group's size; the
        // client refuses before it would need our private value.
        let exchange = vector16([]) + vector16(prime) + vector16([2]) + vector16([4])
        let body = handshake(2, hello) + handshake(12, exchange) + handshake(14, [])
        return [0x16, 0x03, 0x03, UInt8(body.count >> 8), UInt8(body.count & 0xFF)] + body
    }
}

/// What a client answered to a scripted TLS flight.
enum TLSReply: Sendable, Equatable, CustomStringConvertible {
    /// An alert record: level and description.
    case alert(UInt8, UInt8)
    /// It closed without a record.
    case closed
    /// It went on with a handshake record (a ClientKeyExchange).
    case continued
    var description: String {
        switch self {
        case .alert(let level, let code): "alert level \(level) code \(code)\(code == 40 ? " (handshake_failure)" : "")"
        case .closed: "closed without an alert"
        case .continued: "went on with a handshake record (ClientKeyExchange)"
        }
    }
}

extension TargetConformance {
    /// One announcement, under one ephemeral key, of two beacons for `peer`: the first from a stranger
    /// (its flag verifies for `peer`, naming a KeyId it does not know), the second from `identity`.
    static func strangerFirst(for peer: PublicKey, identity: PrivateKey) throws -> BeaconAnnouncement {
        let ephemeralKey = PrivateKey()
        let expiration = DeliveryClock.nowMilliseconds + 600_000
        let stranger = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(for: [peer], expiration: expiration, ephemeralKey: ephemeralKey)
        let ours = try BeaconGenerator(identity: identity).makeAnnouncement(for: [peer], expiration: expiration, ephemeralKey: ephemeralKey)
        // Both streams share the preamble (ephemeral key, expiration); a beacon's PSK identity depends only
        // on the preamble and its own bytes, so ours keeps its identity and PSK at index 1.
        let preamble = ours.profile.preambleLength
        return BeaconAnnouncement(profile: ours.profile, stream: stranger.stream + ours.stream[preamble...], expiration: expiration,
                                  beacons: stranger.beacons + ours.beacons)
    }
}
