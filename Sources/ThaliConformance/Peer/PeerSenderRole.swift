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
    // MARK: Sender role: we deliver an item to it

    func senderRole(_ run: ConformanceRun, server: PeerSuiteServer, discovery: SSDPDiscoveryService?,
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
        // The sender role's steps in the order they happen: the first that breaks FAILs where it breaks,
        // and the ones after it are INCONCLUSIVE, naming it.
        let steps = [Cases.senderConnects, Cases.senderStream, Cases.senderWelcome, Cases.senderProgress, Cases.senderAck,
                     Cases.refusesExpired, Cases.rejectsDamaged, Cases.senderBatch, Cases.senderClose, Cases.senderInbox]
        guard let frames else {
            let failure = lastFailure.withLockedValue { $0 }.map { "; last handshake: \($0)" } ?? ""
            let waited = Self.text(configuration.discoveryTimeout)
            if run.verdict(of: Cases.senderConnects) == .pass {
                run.record(Cases.senderStream, .fail, expected: "a delivery stream opened to us",
                           actual: "authenticated, but no delivery stream within \(waited)")
                run.recordDependents(steps, on: Cases.senderStream)
            } else {
                run.failFirstOpenStep(steps, actual: "no PSK-TLS session with our beacon's PSK within \(waited)\(failure)")
            }
            return
        }
        run.recordRemaining([Cases.senderConnects], .pass, because: "it opened a stream, so it authenticated")
        let streamStarted = NIODeadline.now()
        var delivered: [(id: UUID, text: String)] = []
        var unwanted: [UUID] = []  // items it must not keep: the expired one and the damaged ones
        // The step under way: a stream that ends or fails breaks this one.
        var step = Cases.senderWelcome
        var stepStarted = streamStarted
        func begin(_ next: ConformanceCase) {
            step = next
            stepStarted = .now()
        }
        do {
            try await frames.executeThenClose { inbound, outbound in
                try await outbound.write(.hello(version: DeliveryFrame.protocolVersion))
                var iterator = inbound.makeAsyncIterator()
                let welcome = try await iterator.next()
                guard case .welcome(let version, let maximum, let window, let linger)? = welcome else {
                    run.record(Cases.senderWelcome, .fail, expected: "welcome", actual: welcome?.name ?? "the stream ended", started: streamStarted)
                    return
                }
                let speaksProgress = Self.gradeWelcome(run, version: version, maximum: maximum, window: window, linger: linger, started: streamStarted)
                begin(Cases.senderStream)
                try await outbound.write(.offer(offer))
                guard let answer = try await iterator.next() else {
                    run.record(Cases.senderStream, .fail, expected: "an answer to our offer", actual: "the stream ended", started: stepStarted)
                    return
                }
                guard case .answer(let id, let what) = answer, id == offer.id else {
                    run.record(Cases.senderStream, .fail, expected: "answer(\(offer.id))", actual: answer.name, started: stepStarted)
                    return
                }
                run.record(Cases.senderStream, .pass, expected: Cases.senderStream.title, actual: "answer \(Self.describe(what))", started: stepStarted)
                begin(Cases.senderAck)
                let offset: UInt64
                switch what {
                case .nothing, .partial: offset = 0  // start(0) is always allowed
                case .complete:
                    run.record(Cases.senderAck, .fail, expected: "nothing (a new item)", actual: "complete for an item it cannot hold")
                    return
                case .refused(let reason):
                    run.record(Cases.senderAck, .fail, expected: "the item taken", actual: "refused(\(Self.describe(reason)))")
                    return
                }
                try await outbound.write(contentsOf: [.start(id: offer.id, offset: offset), .data(ByteBuffer(bytes: content)), .end(id: offer.id)])
                let (reply, reports) = try await Self.settle(&iterator)
                if speaksProgress { Self.gradeProgress(run, reports, of: offer, sent: UInt64(content.count), started: stepStarted) }
                guard case .ack(let acked)? = reply, acked == offer.id else {
                    run.record(Cases.senderAck, .fail, expected: "ack(\(offer.id))", actual: reply?.name ?? "the stream ended", started: stepStarted)
                    return
                }
                delivered.append((offer.id, String(decoding: content, as: UTF8.self)))
                run.record(Cases.senderAck, .pass, expected: Cases.senderAck.title, actual: "ack", started: stepStarted)
                begin(Cases.refusesExpired)
                unwanted.append(try await offerExpired(run, content: content, inbound: &iterator, outbound: outbound))
                begin(Cases.rejectsDamaged)
                unwanted.append(try await sendDamaged(run, content: content, inbound: &iterator, outbound: outbound))
                if speaksProgress {
                    begin(Cases.senderBatch)
                    let (intact, damaged) = try await sendBatch(run, inbound: &iterator, outbound: outbound)
                    delivered += intact
                    unwanted.append(damaged)
                }
                begin(Cases.senderClose)
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
                          actual: after ?? "ended", started: stepStarted)
            }
        } catch {
            // The step under way broke (the stream ended or failed while we waited for its answer).
            if run.verdict(of: step) == nil {
                run.record(step, .fail, expected: step.title, actual: "the stream failed: \(error)", started: stepStarted)
            }
        }
        // A step that broke above leaves every later stream step ungraded: INCONCLUSIVE, naming it.
        let streamSteps = Array(steps.dropLast())
        if let broken = streamSteps.first(where: { [.fail, .inconclusive].contains(run.verdict(of: $0)) }) {
            run.recordDependents(streamSteps, on: broken)
            // Nothing acknowledged: there is no inbox to check either.
            if delivered.isEmpty { run.recordDependents([Cases.senderInbox], on: broken) }
        }
        await checkInbox(run, delivered: delivered, unwanted: unwanted)
    }

    /// Grades its welcome to our hello(5) and returns whether it speaks version 3 or later (4 has 3's
    /// fields, 5 adds the receiver's linger; a version 3 or 4 receiver rightly answers with its own). A
    /// version 2 welcome is what an older receiver rightly answers: a warning, and its version 3 cases
    /// do not apply. We never linger, so the linger a version 5 receiver states is only read.
    static func gradeWelcome(_ run: ConformanceRun, version: UInt8, maximum: UInt32, window: UInt32?, linger: UInt32? = nil,
                             started: NIODeadline) -> Bool {
        let speaksProgress = version >= DeliveryFrame.progressVersion
        let minimumWindow = 2 * DeliveryLimits.minimumFramePayloadBytes
        let wellFormed = (probeDeliveryVersion2...DeliveryFrame.protocolVersion).contains(version)
            && maximum >= DeliveryLimits.minimumFramePayloadBytes
            && (speaksProgress ? window.map { $0 >= minimumWindow } ?? false : window == nil)
        let verdict: ConformanceVerdict = !wellFormed ? .fail : speaksProgress ? .pass : .warn
        run.record(Cases.senderWelcome, verdict,
                   expected: "welcome(\(DeliveryFrame.progressVersion) or \(DeliveryFrame.protocolVersion), ≥ \(DeliveryLimits.minimumFramePayloadBytes), ≥ \(minimumWindow))",
                   actual: "welcome(\(version), \(maximum)\(window.map { ", \($0)" } ?? "")\(linger.map { ", linger \($0) ms" } ?? ""))" + (speaksProgress ? "" : ": an older receiver"),
                   started: started)
        if !speaksProgress {
            for testCase in [Cases.senderProgress, Cases.senderBatch] {
                run.record(testCase, .notApplicable, expected: testCase.title, actual: "a version \(version) receiver")
            }
        }
        return speaksProgress && wellFormed
    }

    /// Reads the receiver's next frame that is not `progress`, and the progress reports before it.
    static func settle(_ inbound: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator) async throws
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
    static func gradeProgress(_ run: ConformanceRun, _ reports: [(id: UUID, bytes: UInt64)], of offer: ItemOffer, sent: UInt64,
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
    func sendBatch(_ run: ConformanceRun, inbound: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
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
    func offerExpired(_ run: ConformanceRun, content: [UInt8],
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
    func sendDamaged(_ run: ConformanceRun, content: [UInt8],
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
        case .answer(_, let answer): "answer \(describe(answer))"
        case .reject(_, let reason): "reject(\(describe(reason)))"
        default: frame.name
        }
    }

    /// An answer as spec/node.md writes it: `refused(expired, reason 3)`, never a Swift type's name.
    static func describe(_ answer: ItemAnswer) -> String {
        switch answer {
        case .nothing: "nothing"
        case .partial(let offset, _): "partial(\(offset))"
        case .complete: "complete"
        case .refused(let reason): "refused(\(describe(reason)))"
        }
    }

    /// A refusal's name and code: `expired, reason 3`.
    static func describe(_ reason: ItemRefusal) -> String {
        "\(reason.code.replacingOccurrences(of: "_", with: " ")), reason \(reason.rawValue)"
    }

    /// A reject's name and code: `digest mismatch, reason 1`.
    static func describe(_ failure: TransferFailure) -> String {
        switch failure {
        case .digestMismatch: "digest mismatch, reason \(failure.rawValue)"
        case .invalidText: "invalid text, reason \(failure.rawValue)"
        }
    }

    func checkInbox(_ run: ConformanceRun, delivered: [(id: UUID, text: String)], unwanted: [UUID]) async {
        guard run.verdict(of: Cases.senderInbox) == nil else { return }
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
}
