import Crypto
import Foundation
import NIOCore
import TCPMultiplexer
import ThaliNodeCore

extension PeerConformance.Cases {
    /// `peer/delivery/complete-removes`: an item we answer `complete` is not offered again on a later stream.
    public static let completeRemoves = ConformanceCase("peer/delivery/complete-removes",
                                                        "an item we answer complete is not offered again on a later stream",
                                                        ["NODE-1.6"])
    /// `peer/delivery/refused-not-offered`: an item we answer `refused` is not offered again on a later stream.
    public static let refusedNotOffered = ConformanceCase("peer/delivery/refused-not-offered",
                                                          "an item we answer refused (too large) is not offered again on a later stream",
                                                          ["NODE-1.7"])
    /// `peer/delivery/partial-resumed`: answered `partial(n, h)`, it starts at n when h is the SHA-256 of
    /// its first n bytes (and the rest completes the item), at 0 when it is not.
    public static let partialResumed = ConformanceCase("peer/delivery/partial-resumed",
                                                       "answered partial(n, h) with h the SHA-256 of its first n bytes, it sends start(n) and the rest of the item; with another h, start(0) and all of it",
                                                       ["NODE-1.9"])
    /// `peer/delivery/error-frame`: answered for an item it did not offer, it ends the stream with an
    /// `error` frame carrying a code and the reason in words, each of three times.
    public static let errorFrame = ConformanceCase("peer/delivery/error-frame",
                                                   "answered for an item it did not offer (welcomed with version 2), it sends an error frame with a code and the reason in words, then ends the stream, on each of three streams",
                                                   ["NODE-1.24"])

    /// The cases of the answers streams, after the receiver role's first two.
    static let answers = [completeRemoves, refusedNotOffered, partialResumed, errorFrame]
}

extension PeerConformance {
    /// How the suite answers each text it queued for the answers streams.
    enum PlannedAnswer: Equatable {
        case complete, refused, partialMatching, partialDiffering, otherID, take
    }

    /// The prefix length of the partial answers: short of every queued text.
    static let partialOffset = 16

    /// What one answers stream saw of each item: how it was offered and, if taken, where its content
    /// started and whether the bytes (with the prefix we claimed) matched the offer.
    struct AnswersSeen {
        var offered: [UUID] = []
        var started: [UUID: UInt64] = [:]
        var intact: [UUID: Bool] = [:]
        /// What followed our answer for an item it did not offer: the error frame, or what came instead.
        var afterOtherID: String?
        var errorFrame: (code: DeliveryErrorCode, reason: String)?
        var problem: String?
        /// The version its hello said on this stream.
        var helloVersion: UInt8?
    }

    /// Items it offers answered by plan on more streams of the receiver's session, each welcomed with
    /// version 2 (offers only: no batches, no progress): `complete`, `refused` and two `partial` answers on
    /// the first; an answer for an item it did not offer on each of the next ``errorFrameStreams`` (its
    /// `error` frame); on the last,
    /// every item it still offers is taken, and the completed and refused ones must not be among them
    /// [NODE-1.6, NODE-1.7, NODE-1.9, NODE-1.24].
    func gradeAnswers(_ run: ConformanceRun, over session: MultiplexerSession, limits: DeliveryLimits) async {
        let started = NIODeadline.now()
        guard let adapter = configuration.adapter else {
            run.recordRemaining(Cases.answers, .inconclusive, because: "no adapter: nothing queued to answer")
            return
        }
        guard let hello = run.report.results.first(where: { $0.testCase == Cases.hello }), [.pass, .warn].contains(hello.verdict) else {
            run.recordRemaining(Cases.answers, .inconclusive, because: "no hello on the first stream")
            return
        }
        var texts: [UUID: [UInt8]] = [:]
        var plan: [UUID: PlannedAnswer] = [:]
        do {
            for answer in [PlannedAnswer.complete, .refused, .partialMatching, .partialDiffering] {
                let text = "thali-conformance answers text \(answer) \(UUID().uuidString)"
                let id = try await adapter.send(text: text, to: configuration.nameAtPeer)
                (texts[id], plan[id]) = (Array(text.utf8), answer)
            }
        } catch {
            run.recordRemaining(Cases.answers, .inconclusive, because: "adapter: \(error)")
            return
        }
        guard let first = await answerStream(over: session, limits: limits, plan: plan, texts: texts) else {
            run.recordRemaining(Cases.answers, .inconclusive, because: "no answers stream was served")
            return
        }
        gradePartial(run, first, plan: plan, texts: texts, started: started)

        // Second stream: one more text, answered for another id.
        // Second, each of a few streams: one more text, answered for another id. The report must come
        // every time (a report lost to a race shows only some of the time).
        var errorSeen: [AnswersSeen] = []
        let errorStarted = NIODeadline.now()
        // spec/node.md: nobody sends `error` to a version 1 peer, so a version 1 sender has none to send.
        let errorStreams = first.helloVersion.map { $0 >= probeDeliveryVersion2 } ?? true ? Self.errorFrameStreams : 0
        for _ in 0..<errorStreams {
            guard let id = try? await adapter.send(text: "thali-conformance error text \(UUID().uuidString)", to: configuration.nameAtPeer),
                  let seen = await answerStream(over: session, limits: limits, plan: [id: .otherID], texts: [:]) else { break }
            errorSeen.append(seen)
        }
        if errorStreams == 0 {
            run.record(Cases.errorFrame, .notApplicable, expected: Cases.errorFrame.title,
                       actual: "a version 1 sender: error frames are version 2 and later")
        } else {
            gradeErrorFrame(run, errorSeen, started: errorStarted)
        }

        // Last stream: what is still offered is taken. The completed and refused items must be offered on
        // no later stream (an error stream takes any item offered before its own text).
        let third = await answerStream(over: session, limits: limits, plan: [:], texts: [:])
        let again = third.map { third in AnswersSeen(offered: errorSeen.flatMap(\.offered) + third.offered) }
        for (testCase, planned) in [(Cases.completeRemoves, PlannedAnswer.complete), (Cases.refusedNotOffered, .refused)] {
            guard let id = plan.first(where: { $0.value == planned })?.key, first.offered.contains(id) else {
                run.record(testCase, .inconclusive, expected: testCase.title, actual: "the item was not offered on the first answers stream", started: started)
                continue
            }
            guard let again else {
                run.record(testCase, .inconclusive, expected: testCase.title, actual: "no later stream was served", started: started)
                continue
            }
            let offeredAgain = again.offered.contains(id)
            run.grade(testCase, holds: !offeredAgain, expected: "not offered on the later streams",
                      actual: offeredAgain ? "offered again (\(again.offered.count) item(s) on the later streams)"
                          : "not offered again (\(again.offered.count) other item(s) on the later streams)", started: started)
        }
    }

    private func gradePartial(_ run: ConformanceRun, _ seen: AnswersSeen, plan: [UUID: PlannedAnswer], texts: [UUID: [UInt8]], started: NIODeadline) {
        let testCase = Cases.partialResumed
        let n = UInt64(Self.partialOffset)
        guard let matching = plan.first(where: { $0.value == .partialMatching })?.key,
              let differing = plan.first(where: { $0.value == .partialDiffering })?.key,
              seen.offered.contains(matching), seen.offered.contains(differing) else {
            run.record(testCase, .inconclusive, expected: testCase.title,
                       actual: seen.problem ?? "the texts were not offered on the answers stream", started: started)
            return
        }
        func shown(_ id: UUID) -> String {
            guard let offset = seen.started[id] else { return "no start" }
            return "start(\(offset)), " + (seen.intact[id] == true ? "the item completed" : "the bytes do not make the item")
        }
        let holds = seen.started[matching] == n && seen.intact[matching] == true
            && seen.started[differing] == 0 && seen.intact[differing] == true
        run.grade(testCase, holds: holds, expected: "partial(\(n), its prefix's SHA-256): start(\(n)) and the rest; partial(\(n), another): start(0) and all",
                  actual: "matching prefix: \(shown(matching)); differing prefix: \(shown(differing))"
                      + (seen.problem.map { "; \($0)" } ?? ""), started: started)
    }

    private func gradeErrorFrame(_ run: ConformanceRun, _ seen: [AnswersSeen], started: NIODeadline) {
        let testCase = Cases.errorFrame
        let afters = seen.compactMap(\.afterOtherID)
        guard !seen.isEmpty, afters.count == seen.count else {
            run.record(testCase, .inconclusive, expected: testCase.title,
                       actual: seen.compactMap(\.problem).first ?? "the text was not offered", started: started)
            return
        }
        let reported = seen.filter { !($0.errorFrame?.reason ?? "").isEmpty }.count
        run.grade(testCase, holds: reported == seen.count,
                  expected: "on each of \(seen.count) streams an error frame with a code and a reason in words, then the end",
                  actual: reported == seen.count ? "\(afters[0]) (\(reported) of \(seen.count) streams)"
                      : afters.enumerated().map { "stream \($0.offset + 1): \($0.element)" }.joined(separator: "; "),
                  started: started)
    }

    /// Opens delivery streams on `session` until one is served (the sender of the stream before may
    /// still hold its claim: the new one then closes before its hello), welcomes it with version 2 and
    /// answers its offers by `plan` (an item not in it is taken) until `done` or the stream's end. Nil
    /// when no stream was served.
    func answerStream(over session: MultiplexerSession, limits: DeliveryLimits, plan: [UUID: PlannedAnswer],
                      texts: [UUID: [UInt8]]) async -> AnswersSeen? {
        for _ in 0..<Self.fallbackStreamAttempts {
            guard let frames = try? await DeliveryChannel.openStream(on: session, limits: limits, dataDelivery: .wholeFrames) else { return nil }
            var seen = AnswersSeen()
            var served = false
            do {
                try await frames.executeThenClose { inbound, outbound in
                    var iterator = inbound.makeAsyncIterator()
                    guard case .hello(let version)? = try await iterator.next() else { return }
                    served = true
                    seen.helloVersion = version
                    if version >= probeDeliveryVersion2 {
                        try await outbound.write(.welcome(version: probeDeliveryVersion2,
                                                          maxFramePayloadBytes: UInt32(ReceiverScript.announcedFrameMaximum)))
                    }
                    try await Self.answerOffers(&iterator, outbound, plan: plan, texts: texts, into: &seen)
                }
            } catch {
                if served, seen.problem == nil { seen.problem = "the stream failed: \(error)" }
            }
            if served { return seen }
        }
        return nil
    }

    /// Reads offers and answers each by `plan` until `done`.
    private static func answerOffers(_ inbound: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                                     _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>, plan: [UUID: PlannedAnswer],
                                     texts: [UUID: [UInt8]], into seen: inout AnswersSeen) async throws {
        // Bounded by the items it may offer: an implementation offering without end is cut off.
        for _ in 0..<maxAnsweredOffers {
            guard let frame = try await inbound.next() else {
                seen.problem = seen.problem ?? "the stream ended before done"
                return
            }
            guard case .offer(let offer) = frame else {
                if case .done = frame { return }
                seen.problem = "a \(frame.name) frame where an offer or done was due"
                return
            }
            seen.offered.append(offer.id)
            let prefix = texts[offer.id].map { Array($0.prefix(partialOffset)) } ?? []
            switch plan[offer.id] ?? .take {
            case .complete:
                try await outbound.write(.answer(id: offer.id, .complete))
            case .refused:
                try await outbound.write(.answer(id: offer.id, .refused(.tooLarge)))
            case .partialMatching:
                try await outbound.write(.answer(id: offer.id, .partial(offset: UInt64(prefix.count), prefixSHA256: Array(SHA256.hash(data: prefix)))))
                try await take(offer, claimedPrefix: prefix, &inbound, outbound, into: &seen)
            case .partialDiffering:
                let other = prefix.map { $0 ^ 0x20 }
                try await outbound.write(.answer(id: offer.id, .partial(offset: UInt64(other.count), prefixSHA256: Array(SHA256.hash(data: other)))))
                // A resume here would build on the bytes we claimed, not on its own.
                try await take(offer, claimedPrefix: other, &inbound, outbound, into: &seen)
            case .take:
                try await outbound.write(.answer(id: offer.id, .nothing))
                try await take(offer, claimedPrefix: [], &inbound, outbound, into: &seen)
            case .otherID:
                let other = UUID()
                try await outbound.write(.answer(id: other, .nothing))
                let reply: DeliveryFrame?
                do {
                    reply = try await inbound.next()
                } catch {
                    seen.afterOtherID = "no error frame: the stream failed (\(error))"
                    return
                }
                guard case .error(let code, let reason)? = reply else {
                    seen.afterOtherID = reply.map { "a \($0.name) frame, no error frame" } ?? "the stream ended without an error frame"
                    return
                }
                seen.errorFrame = (code, reason)
                let end = (try? await inbound.next()).map { ", then a \($0.name) frame" } ?? ", then the end"
                seen.afterOtherID = "error \(code): \"\(reason.prefix(200))\"\(end)"
                return
            }
        }
        seen.problem = "more than \(maxAnsweredOffers) offers"
    }

    /// How many streams the error-frame case answers for another id.
    static let errorFrameStreams = 3

    /// The most offers read on one answers stream (the suite queued seven).
    static let maxAnsweredOffers = 64

    /// Reads `start`, the data and `end` of `offer`; a start past 0 is taken to resume after
    /// `claimedPrefix` (the bytes our partial answer claimed we hold). Records the start, whether the
    /// bytes make the offered item, and answers `ack` or `reject`.
    private static func take(_ offer: ItemOffer, claimedPrefix: [UInt8],
                             _ inbound: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                             _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>, into seen: inout AnswersSeen) async throws {
        guard case .start(offer.id, let offset)? = try await inbound.next() else {
            seen.problem = "no start for \(offer.id)"
            return
        }
        seen.started[offer.id] = offset
        var hasher = SHA256()
        var received = offset
        if offset > 0 {
            guard offset == UInt64(claimedPrefix.count) else {
                seen.problem = "start(\(offset)) after our partial(\(claimedPrefix.count))"
                return
            }
            hasher.update(data: claimedPrefix)
        }
        while let frame = try await inbound.next() {
            switch frame {
            case .data(let buffer):
                received += UInt64(buffer.readableBytes)
                guard received <= offer.size else {
                    seen.problem = "more than \(offer.size) bytes of \(offer.id)"
                    return
                }
                buffer.withUnsafeReadableBytes { hasher.update(bufferPointer: $0) }
            case .end(offer.id):
                let intact = received == offer.size && Array(hasher.finalize()) == offer.sha256
                seen.intact[offer.id] = intact
                try await outbound.write(intact ? .ack(id: offer.id) : .reject(id: offer.id, .digestMismatch))
                return
            default:
                seen.problem = "a \(frame.name) frame inside \(offer.id)"
                return
            }
        }
        seen.problem = "the stream ended inside \(offer.id)"
    }
}
