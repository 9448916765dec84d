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

extension PeerConformance {
    // MARK: Receiver role: it has an item for us

    func receiverRole(_ run: ConformanceRun, fetched: AsyncStream<(SSDPPeer, [UInt8])>, queuedIDs: [UUID],
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
            run.recordDependents([Cases.closeNotify, Cases.version2Fallback] + Cases.receiverRole, on: Cases.handshake)
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
    func gradeCloseNotify(_ run: ConformanceRun, location: BeaconLocation, match: BeaconMatch) async {
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
    func gradeWithdrawal(_ run: ConformanceRun, events: AsyncStream<SSDPDiscoveryEvent>?) async {
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
    func gradeSearchAnswer(_ run: ConformanceRun) async {
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
    func firstMatch(in fetched: AsyncStream<(SSDPPeer, [UInt8])>,
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
    func poll(_ location: BeaconLocation, receiver: BeaconReceiver) async -> (BeaconMatch, BeaconLocation)? {
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

    func gradeFetch(_ run: ConformanceRun, _ location: BeaconLocation) async {
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
    func receive(_ run: ConformanceRun, over session: MultiplexerSession, queuedIDs: [UUID], limits: DeliveryLimits) async {
        let started = NIODeadline.now()
        let frames: DeliveryChannel.AsyncFrames
        do {
            frames = try await DeliveryChannel.openStream(on: session, limits: limits, dataDelivery: .wholeFrames)
        } catch {
            run.record(Cases.openStream, .fail, expected: Cases.openStream.title, actual: "opening failed: \(error)", started: started)
            run.recordDependents(Cases.receiverRole, on: Cases.openStream)
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
    func gradeVersion2Fallback(_ run: ConformanceRun, over session: MultiplexerSession, limits: DeliveryLimits,
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
    func awaitSecondAnnouncement(from location: BeaconLocation, in fetched: AsyncStream<(SSDPPeer, [UInt8])>) async {
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
}
