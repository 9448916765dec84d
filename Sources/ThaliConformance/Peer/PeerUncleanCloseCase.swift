import NIOCore
import ThaliBeacons
import ThaliSSDP

extension PeerConformance.Cases {
    /// `peer/psk-tls/unclean-close-reported`: a session the suite ends with a bare TCP close after the
    /// handshake is reported, through the adapter's `events` verb, as an unclean end.
    public static let uncleanCloseReported = ConformanceCase("peer/psk-tls/unclean-close-reported",
                                                             "a TCP close without close_notify after the handshake is reported as an unclean end (the adapter's events: disconnected, clean false)",
                                                             ["PSK-6.3"])
}

extension PeerConformance {
    /// A PSK-TLS session ended by a TCP close without close_notify: the implementation must take it as an
    /// error, not a clean end [PSK-6.3]. The wire cannot show that (either way it closes too), so the
    /// verdict comes from its own report, the adapter's `events` verb: the `disconnected` of this session
    /// (its `remote` our end of it; an implementation that gives no `remote` gets the first
    /// `disconnected` for the suite's name, in the accepting role, once its earlier sessions with the
    /// suite have all ended).
    func gradeUncleanClose(_ run: ConformanceRun, events: AdapterEventFollower?, location: BeaconLocation, match: BeaconMatch) async {
        let testCase = Cases.uncleanCloseReported
        let name = configuration.nameAtPeer
        let expected = "a `disconnected` event for \(name) with clean false"
        guard let events else {
            run.record(testCase, .notApplicable, expected: expected, actual: "no adapter, so no events to read")
            return
        }
        if let ended = events.ended, events.count == 0 {
            run.record(testCase, .notApplicable, expected: expected, actual: "the adapter's events verb gave nothing: \(ended)")
            return
        }
        let started = NIODeadline.now()
        // The suite's earlier sessions that it accepted end first: a late report of theirs (a clean end:
        // the suite closed them with close_notify) must not be taken for this one's.
        let earlier = { @Sendable (event: AdapterEvent) in event.contact == name && event.role != "connecting" }
        _ = await events.waitUntil(timeout: configuration.closeNotifyTimeout) { all in
            all.count { $0.event == "connected" && earlier($0) } <= all.count { $0.event == "disconnected" && earlier($0) }
        }
        let mark = events.count
        let closer = BareCloser()
        let channel: Channel
        // Our end of the session, as the implementation's `remote` names it: read while the channel is open.
        let session: String?
        do {
            channel = try await ProbeSession.connect(host: location.host, port: location.port, identity: match.pskIdentity, psk: match.psk,
                                                     timeout: configuration.stepTimeout, on: group.next(), below: [closer])
            // Over Bluetooth it sees its own relay's end, not ours: the earlier sessions' wait alone applies.
            session = configuration.bluetooth != nil ? nil
                : channel.localAddress.flatMap { address in address.ipAddress.flatMap { ip in address.port.map { "\(ip):\($0)" } } }
            // Our side of TCP is shut from below TLS: the close never passes our TLS handler, so no
            // close_notify is written. A shutdown, not a close: a close with anything of the
            // implementation's still unread would send a reset, which it would rightly report as an
            // error too, and then an implementation that takes a bare FIN for a clean end would pass.
            try await channel.eventLoop.flatSubmit {
                do { return try channel.pipeline.syncOperations.context(handler: closer).close(mode: .output) } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }.get()
        } catch {
            run.record(testCase, .inconclusive, expected: expected, actual: "no PSK-TLS session to close: \(error)", started: started)
            return
        }
        let reported = await events.first(after: mark, timeout: configuration.stepTimeout) {
            $0.event == "disconnected" && $0.contact == name && $0.role != "connecting" && ($0.remote == nil || session == nil || $0.remote == session)
        }
        try? await channel.close()  // usually closed already: the implementation closes its side at our FIN
        guard let reported else {
            let seen = events.events(after: mark).suffix(8).map { [$0.event, $0.contact, $0.role].compactMap { $0 }.joined(separator: " ") }
            run.record(testCase, .inconclusive, expected: expected,
                       actual: "no `disconnected` for \(name) within \(Self.text(configuration.stepTimeout))" + (events.ended.map { " (\($0))" } ?? "")
                           + "; its events since the close: " + (seen.isEmpty ? "none" : seen.joined(separator: "; ")),
                       started: started)
            return
        }
        let reason = (reported.reason.map { ", reason \"\($0)\"" } ?? "") + (reported.remote.map { " (the session from \($0))" } ?? "")
        switch reported.clean {
        case false?: run.record(testCase, .pass, expected: expected, actual: "disconnected, clean false\(reason)", started: started)
        case true?: run.record(testCase, .fail, expected: expected, actual: "reported as a clean end\(reason)", started: started)
        case nil: run.record(testCase, .inconclusive, expected: expected, actual: "its `disconnected` has no boolean `clean`\(reason)", started: started)
        }
    }
}

/// Sits between TCP and TLS so that the probe can close the connection from there, past the TLS handler.
private final class BareCloser: ChannelOutboundHandler, Sendable {
    typealias OutboundIn = ByteBuffer
}
