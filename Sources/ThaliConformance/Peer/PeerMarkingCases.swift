import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliNodeCore
import ThaliPSKTLS
import ThaliSSDP

extension PeerConformance.Cases {
    /// `peer/streams/alpn-selected`: offered an unknown ALPN protocol and `thali-streams/1`, it completes
    /// the handshake and selects `thali-streams/1` (one that does not mark streams selects none: a warning).
    public static let alpnSelected = ConformanceCase("peer/streams/alpn-selected",
                                                     "offered an unknown ALPN protocol, then thali-streams/1, it completes the handshake and selects thali-streams/1",
                                                     ["PSK-1.9", "NODE-4.1"])
    /// `peer/streams/unmarked-served`: a session that offers no ALPN is served unmarked, as before marking.
    public static let unmarkedServed = ConformanceCase("peer/streams/unmarked-served",
                                                       "a session that offers no ALPN protocol selects none and serves its stream unmarked: the sender's hello comes first",
                                                       ["NODE-4.2"])
    /// `peer/streams/unknown-kind-refused`: a well-formed header of a kind it does not know is refused
    /// with code 1; its output ends, and the session goes on.
    public static let unknownKindRefused = ConformanceCase("peer/streams/unknown-kind-refused",
                                                           "a header of an unknown kind gets status 1 (unknown-kind), its output ends, and the session goes on",
                                                           ["NODE-4.4", "NODE-4.5"])
    /// `peer/streams/bad-header-refused`: malformed or unfinished headers are refused with code 4, each
    /// stream alone.
    public static let badHeaderRefused = ConformanceCase("peer/streams/bad-header-refused",
                                                         "a header of length 0, one with a space in its kind and half a header ended by our FIN each get status 4 (bad-header), its output ends, and the session goes on",
                                                         ["NODE-4.3", "NODE-4.5"])
    /// `peer/streams/app-not-served`: an app protocol nobody serves is refused with code 2.
    public static let appNotServed = ConformanceCase("peer/streams/app-not-served",
                                                     "a header app/NAME that nothing serves gets status 2 (not-served), its output ends, and the session goes on",
                                                     ["NODE-4.4", "NODE-4.5"])
    /// `peer/streams/delivery-accepted`: after those refusals, on the same session, a `delivery` header
    /// is accepted (status 0 first) and the sender's delivery follows.
    public static let deliveryAccepted = ConformanceCase("peer/streams/delivery-accepted",
                                                         "on the same session a delivery header gets status 0 first, then the sender's hello, and a queued item is delivered",
                                                         ["NODE-4.1", "NODE-4.3", "NODE-4.4"])

    /// The cases of a session that offers `thali-streams/1`.
    static let marking = [alpnSelected, unknownKindRefused, badHeaderRefused, appNotServed, deliveryAccepted]
}

extension PeerConformance {
    /// An ALPN protocol no implementation knows, offered before `thali-streams/1`: a server must pass
    /// over it without an alert [PSK-1.9].
    static let unknownApplicationProtocol = "x-thali-conformance/0"

    /// Grades the unmarked receiver-role session: it offered no ALPN, so none may be selected, and its
    /// delivery stream must have started with the sender's hello (not a status) [NODE-4.2].
    func gradeUnmarked(_ run: ConformanceRun, negotiated: String?) {
        let hello = run.report.results.first { $0.testCase == Cases.hello }
        let helloCame = hello.map { [.pass, .warn].contains($0.verdict) } ?? false
        run.grade(Cases.unmarkedServed, holds: negotiated == nil && helloCame,
                  expected: "no ALPN protocol selected; the stream's first frame the sender's hello",
                  actual: "ALPN \(negotiated ?? "none"); " + (hello.map { "hello: \($0.verdict.rawValue), \($0.actual)" } ?? "no hello graded"))
    }

    /// One session offering `thali-streams/1`: whether it is selected, then refused streams (an unknown
    /// kind, malformed headers, an app protocol nobody serves), each of which must end alone, and a
    /// delivery stream on the same session.
    func markingCases(_ run: ConformanceRun, location: BeaconLocation, match: BeaconMatch) async {
        let started = NIODeadline.now()
        let offered = [Self.unknownApplicationProtocol, StreamHeader.alpnProtocol]
        let expected = "the handshake completes with ALPN \(StreamHeader.alpnProtocol)"
        var tls = PSKTLSConfiguration()
        tls.applicationProtocols = offered
        let client: AuthenticatedSession.Client
        let parameters: PSKTLSNegotiatedParameters
        do {
            let context = try PSKTLSContext(role: .client, configuration: tls)
            client = try await ClientBootstrap(group: group)
                .connectTimeout(configuration.stepTimeout)
                .connect(host: location.host, port: location.port) { channel in
                    AuthenticatedSession.configureClient(on: channel, context: context, identity: match.pskIdentity, psk: match.psk)
                }
            parameters = try await client.handshake.get()
        } catch {
            // The same identity and PSK made a session without ALPN: an alert now is the offer's fault.
            let refused = (error as? PSKTLSError)?.reason == .alertReceived(TLSAlert(rawValue: 120))
            run.record(Cases.alpnSelected, refused ? .fail : .inconclusive, expected: expected, actual: "the handshake failed: \(error)",
                       started: started)
            run.recordRemaining(Cases.marking, .inconclusive, because: "no session offering \(StreamHeader.alpnProtocol)")
            return
        }
        defer { client.session.channel.close(promise: nil) }
        switch parameters.applicationProtocol {
        case StreamHeader.alpnProtocol?:
            run.record(Cases.alpnSelected, .pass, expected: expected, actual: "selected \(StreamHeader.alpnProtocol)", started: started)
        case nil:
            // Allowed: an implementation from before marking; its sessions stay unmarked (peer/streams/unmarked-served).
            // UNSUPPORTED, not WARN: the case grades MUSTs of a feature this implementation does not have.
            run.record(Cases.alpnSelected, .unsupported, expected: expected, actual: "no protocol selected: it does not mark streams", started: started)
            run.recordRemaining(Cases.marking, .unsupported, because: "it does not mark streams (no \(StreamHeader.alpnProtocol) selected)")
            return
        case let other?:
            run.record(Cases.alpnSelected, .fail, expected: expected, actual: "selected \(other.prefix(80)) of \(offered)", started: started)
            run.recordRemaining(Cases.marking, .inconclusive, because: "no marked session")
            return
        }

        let refusals: [(ConformanceCase, StreamRefusal.Code, [(header: [UInt8], endOutput: Bool, what: String)])] = [
            (Cases.unknownKindRefused, .unknownKind, [(Self.header("x-thali-conformance-unknown"), false, "kind x-thali-conformance-unknown")]),
            (Cases.badHeaderRefused, .badHeader, [([0x00], false, "length 0"),
                                                  ([0x09] + Array("deli very".utf8), false, "\"deli very\""),
                                                  ([0x08] + Array("deli".utf8), true, "4 of 8 bytes, then our FIN")]),
            (Cases.appNotServed, .notServed, [(Self.header("app/thali-conformance-nobody"), false, "kind app/thali-conformance-nobody")]),
        ]
        for (testCase, code, probes) in refusals {
            let caseStarted = NIODeadline.now()
            var problems: [String] = []
            var seen: [String] = []
            for probe in probes {
                let (answer, ended) = await openMarked(on: client.session, header: probe.header, endOutput: probe.endOutput)
                seen.append("\(probe.what): \(answer)" + (answer.refusalCode == nil ? "" : ended ? ", output ended" : ", output still open"))
                if answer.refusalCode != code { problems.append(probe.what) }
                if answer.refusalCode != nil && !ended { problems.append("\(probe.what) left open") }
            }
            let alive = await isAlive(client.session)
            run.grade(testCase, holds: problems.isEmpty && alive,
                      expected: "status \(code.rawValue) (\(code)), then the end of its output, on each; the session still answering a ping",
                      actual: seen.joined(separator: "; ") + (alive ? "; the session goes on" : "; the session ended"), started: caseStarted)
        }
        await gradeMarkedDelivery(run, session: client.session)
    }

    /// `length ‖ kind` for a well-formed kind.
    static func header(_ kind: String) -> [UInt8] {
        [UInt8(kind.utf8.count)] + Array(kind.utf8)
    }

    /// Opens a stream that starts with `header` and reads its answer, then whether the implementation
    /// ended its output after a refusal; our side is closed after.
    private func openMarked(on session: MultiplexerSession, header: [UInt8], endOutput: Bool) async -> (MarkedStreamAnswer, ended: Bool) {
        let loop = session.channel.eventLoop
        let answer = loop.makePromise(of: MarkedStreamAnswer.self)
        let ended = loop.makePromise(of: Void.self)
        let timeout = configuration.stepTimeout
        let stream: Channel
        do {
            stream = try await session.openStream(initializer: { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                    try stream.pipeline.syncOperations.addHandler(MarkedStreamOpener(header: header, endOutput: endOutput, timeout: timeout,
                                                                                     answer: answer, ended: ended))
                }
            }).get()
        } catch {
            answer.succeed(.ended(received: 0))
            ended.succeed(())
            return (.ended(received: 0), false)
        }
        let first = (try? await answer.futureResult.get()) ?? .ended(received: 0)
        // Only a refusal promises the end of its output; anything else is graded by its first bytes.
        var closed = false
        if first.refusalCode != nil { closed = (try? await ended.futureResult.get()) != nil }
        try? await stream.close()
        return (first, closed)
    }

    /// Whether the session still answers a ping within the step timeout.
    private func isAlive(_ session: MultiplexerSession) async -> Bool {
        let answered = await withDeadline(configuration.stepTimeout) { try? await session.ping().get() }
        return answered != nil && session.channel.isActive
    }

    /// A `delivery` stream on the marked session: status 0 before anything else, then the sender's
    /// protocol, played apart (welcome version 2, so only the basics are asked) and summed up here.
    private func gradeMarkedDelivery(_ run: ConformanceRun, session: MultiplexerSession) async {
        let testCase = Cases.deliveryAccepted
        let started = NIODeadline.now()
        var queued: [UUID] = []
        if let adapter = configuration.adapter {
            do {
                queued.append(try await adapter.send(text: "thali-conformance marked text \(UUID().uuidString)", to: configuration.nameAtPeer))
            } catch {
                run.record(testCase, .inconclusive, expected: testCase.title, actual: "adapter: \(error)", started: started)
                return
            }
        }
        let loop = session.channel.eventLoop
        let answer = loop.makePromise(of: MarkedStreamAnswer.self)
        let ended = loop.makePromise(of: Void.self)
        let timeout = configuration.stepTimeout
        let frames: DeliveryChannel.AsyncFrames
        do {
            frames = try await DeliveryChannel.openStream(on: session, limits: configuration.deliveryLimits, dataDelivery: .wholeFrames) { stream in
                try stream.pipeline.syncOperations.addHandler(MarkedStreamOpener(header: Self.header(StreamKind.delivery.name), timeout: timeout,
                                                                                 answer: answer, ended: ended))
            }
        } catch {
            answer.succeed(.ended(received: 0))
            ended.succeed(())
            run.record(testCase, .fail, expected: testCase.title, actual: "the stream did not open: \(error)", started: started)
            return
        }
        let first = (try? await answer.futureResult.get()) ?? .ended(received: 0)
        guard first == .status(.accepted) else {
            try? await frames.executeThenClose { _, _ in }
            run.record(testCase, .fail, expected: "status 0 (accepted) first", actual: first.description, started: started)
            return
        }
        let scratch = ConformanceRun(target: "marked delivery stream", catalog: nil)
        var script = ReceiverScript(queuedIDs: queued, maxItemBytes: configuration.maxItemBytes, skew: configuration.clockSkewMilliseconds,
                                    welcomeVersion: probeDeliveryVersion2)
        await converse(frames, &script, scratch)
        script.ended(by: "the stream ended", scratch)
        let asked = queued.isEmpty ? [Cases.openStream, Cases.hello] : [Cases.openStream, Cases.hello, Cases.offer, Cases.transfer, Cases.done]
        let results = scratch.report.results.filter { asked.contains($0.testCase) }
        let wrong = results.filter { ![.pass, .warn, .notApplicable].contains($0.verdict) }
        let missing = queued.filter { !script.offeredIDs.contains($0) }
        let actual = wrong.isEmpty && missing.isEmpty
            ? "status 0, then " + (queued.isEmpty ? "hello (no adapter: nothing queued)" : "hello, \(script.offeredIDs.count) item(s), done")
            : "status 0, then " + (wrong.map { "\($0.testCase.id.split(separator: "/").last ?? ""): \($0.actual)" }
                + (missing.isEmpty ? [] : ["the queued item not offered"])).joined(separator: "; ")
        run.grade(testCase, holds: wrong.isEmpty && missing.isEmpty && !results.isEmpty,
                  expected: "status 0 first, then hello, the queued item offered and transferred, done", actual: actual, started: started)
    }
}
