import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import ThaliNetLab
import ThaliNodeCore
import ThaliProcess

#if canImport(Glibc)
import Glibc
#endif

/// `thali-node bench links --profile NAME`: the node over a real-looking link (issue 38). Builds a lab of
/// two hosts joined by the profile's wire (``NetLab``), and in the same run measures plain TCP between
/// them (the reference: bulk and a 64-byte request/response round trip on our own sockets), then two real
/// `thali-node run` processes, one in each host: texts queued before start (time from start to the first
/// delivery, texts per second), relay mode with a request/response app (median and p99 round trip) and a
/// bulk download through it, texts sent one at a time to the running nodes (round trip from `send` to the
/// sender's `delivered`); then, with fresh nodes, a file. Every item is checked to arrive exactly once.
struct BenchLinks: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "links",
        abstract: "Measure the node against plain TCP over a shaped lab link (root; network namespaces and TAP devices).",
        discussion: """
            Profiles: \(LinkProfile.named.map(\.name).joined(separator: ", ")). Rates in MB/s (10^6 bytes); round \
            trips in ms. --json prints one object: profile, tcp_mb_s, tcp_rtt_ms, tcp_rtt_p99_ms, file_mb_s, file_s, \
            file_tcp_ratio, texts, texts_per_s, first_delivery_s, relay_mb_s, relay_rtt_ms, relay_rtt_p99_ms, \
            text_requests, text_rtt_ms, text_rtt_p99_ms (a text sent to the running nodes, from `send`'s exit to a's \
            `delivered`), text_rtt_count (how many were delivered), text_send_ms (the `send` process itself, not in the \
            round trip), text_notice_ms (from `send`'s exit to a's `advertising`: the outbox poll) and \
            text_announced_rtt_ms (from a's `advertising` to its `delivered`), text_matched_rtt_ms (from b's `matched` \
            to a's `delivered`: the delivery exchange; these three only of texts a announced), text_unannounced_count \
            (texts delivered with no announcement between their `send` and their delivery: offered on a delivery \
            session that lingered, version 5), lost_items, duplicated_items, wire_dropped_frames, wire_outages, address_changes, file_resumes and \
            file_restarts (the file's transfers begun again at an offset, and from zero), and the sizes; a figure that could not \
            be measured (nothing arrived in time) is null.
            """)

    @OptionGroup var link: LinkProfileOptions
    @Option(help: "MiB of the plain TCP bulk transfer.") var tcpMib = 16
    @Option(help: "MiB of the file delivered between the nodes (0: skip it).") var fileMib = 16
    @Option(help: "Texts queued before the nodes start.") var texts = 200
    @Option(help: "MiB of the bulk download through the relay (0: skip the relay).") var relayMib = 8
    @Option(help: "Request/response round trips timed, on plain TCP and through the relay (after 10% more as warm-up).")
    var requests = 200
    @Option(help: """
        Texts sent one at a time to the running nodes once the queued ones arrived, each with `thali-node send` and \
        timed from its exit to the sender's `delivered` (0: skip).
        """)
    var textRequests = 50
    @Option(help: "Give up on each phase (texts, relay set-up, file) after this many seconds.") var timeout = 120.0
    @Option(help: "Seed of the wire's random draws (default: random).") var seed: UInt64?
    @Flag(help: """
        Also measure plain TCP over a bare veth pair between two namespaces (no wire): what the wire itself \
        adds (keys veth_tcp_mb_s, veth_tcp_rtt_ms, wire_added_rtt_ms; meaningful with --profile unshaped).
        """)
    var vethReference = false
    @Flag(help: "Print one JSON object instead of lines.") var json = false

    /// Bytes of each small response (plain TCP and relay round trips).
    static let responseBytes = 64

    func validate() throws {
        guard (1...4096).contains(tcpMib) else { throw ValidationError("--tcp-mib must be in 1...4096") }
        guard (0...4096).contains(fileMib) else { throw ValidationError("--file-mib must be in 0...4096") }
        guard (1...100_000).contains(texts) else { throw ValidationError("--texts must be in 1...100000") }
        guard (0...4096).contains(relayMib) else { throw ValidationError("--relay-mib must be in 0...4096") }
        guard (1...100_000).contains(requests) else { throw ValidationError("--requests must be in 1...100000") }
        guard (0...10_000).contains(textRequests) else { throw ValidationError("--text-requests must be in 0...10000") }
        guard timeout > 0 else { throw ValidationError("--timeout must be positive") }
    }

    /// The figures of one run, as `--json` prints them.
    struct Figures: Encodable {
        var profile: String
        var tcpMBs: Double
        var tcpRTTMs: Double
        var tcpRTTP99Ms: Double
        var fileMBs: Double?
        var fileSeconds: Double?
        var fileTCPRatio: Double?
        var texts: Int
        var textsPerSecond: Double?
        var firstDeliverySeconds: Double?
        var relayMBs: Double?
        var relayRTTMs: Double?
        var relayRTTP99Ms: Double?
        var textRequests = 0
        var textRTTMs: Double?
        var textRTTP99Ms: Double?
        var textRTTCount = 0
        var textUnannouncedCount = 0
        var textSendMs: Double?
        var textNoticeMs: Double?
        var textAnnouncedRTTMs: Double?
        var textMatchedRTTMs: Double?
        var lostItems: Int
        var duplicatedItems: Int
        var wireDroppedFrames: Int
        var wireOutages: Int
        var addressChanges = 0
        var fileResumes = 0
        var fileRestarts = 0
        var tcpMiB: Int
        var fileMiB: Int
        var relayMiB: Int
        var requests: Int
        var vethTCPMBs: Double?
        var vethTCPRTTMs: Double?

        enum CodingKeys: String, CodingKey {
            case profile, texts, requests
            case tcpMBs = "tcp_mb_s", tcpRTTMs = "tcp_rtt_ms", tcpRTTP99Ms = "tcp_rtt_p99_ms"
            case fileMBs = "file_mb_s", fileSeconds = "file_s", fileTCPRatio = "file_tcp_ratio"
            case textsPerSecond = "texts_per_s", firstDeliverySeconds = "first_delivery_s"
            case relayMBs = "relay_mb_s", relayRTTMs = "relay_rtt_ms", relayRTTP99Ms = "relay_rtt_p99_ms"
            case textRequests = "text_requests", textRTTMs = "text_rtt_ms", textRTTP99Ms = "text_rtt_p99_ms"
            case textRTTCount = "text_rtt_count", textUnannouncedCount = "text_unannounced_count", textSendMs = "text_send_ms", textNoticeMs = "text_notice_ms"
            case textAnnouncedRTTMs = "text_announced_rtt_ms", textMatchedRTTMs = "text_matched_rtt_ms"
            case lostItems = "lost_items", duplicatedItems = "duplicated_items"
            case wireDroppedFrames = "wire_dropped_frames", wireOutages = "wire_outages", addressChanges = "address_changes"
            case fileResumes = "file_resumes", fileRestarts = "file_restarts"
            case tcpMiB = "tcp_mib", fileMiB = "file_mib", relayMiB = "relay_mib"
            case vethTCPMBs = "veth_tcp_mb_s", vethTCPRTTMs = "veth_tcp_rtt_ms", wireAddedRTTMs = "wire_added_rtt_ms"
        }

        func encode(to encoder: Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            func rounded(_ value: Double?) -> Double? { value.map { ($0 * 1000).rounded() / 1000 } }
            try container.encode(profile, forKey: .profile)
            // Explicit nulls: a script reads every key.
            let figures: [(CodingKeys, Double?)] = [
                (.tcpMBs, tcpMBs), (.tcpRTTMs, tcpRTTMs), (.tcpRTTP99Ms, tcpRTTP99Ms),
                (.fileMBs, fileMBs), (.fileSeconds, fileSeconds), (.fileTCPRatio, fileTCPRatio),
                (.textsPerSecond, textsPerSecond), (.firstDeliverySeconds, firstDeliverySeconds),
                (.relayMBs, relayMBs), (.relayRTTMs, relayRTTMs), (.relayRTTP99Ms, relayRTTP99Ms),
                (.textRTTMs, textRTTMs), (.textRTTP99Ms, textRTTP99Ms), (.textSendMs, textSendMs),
                (.textNoticeMs, textNoticeMs), (.textAnnouncedRTTMs, textAnnouncedRTTMs), (.textMatchedRTTMs, textMatchedRTTMs),
            ]
            for (key, value) in figures { try container.encode(rounded(value), forKey: key) }
            let counts: [(CodingKeys, Int)] = [
                (.texts, texts), (.textRequests, textRequests), (.textRTTCount, textRTTCount), (.textUnannouncedCount, textUnannouncedCount),
                (.lostItems, lostItems), (.duplicatedItems, duplicatedItems), (.wireDroppedFrames, wireDroppedFrames),
                (.wireOutages, wireOutages), (.addressChanges, addressChanges), (.fileResumes, fileResumes),
                (.fileRestarts, fileRestarts), (.tcpMiB, tcpMiB), (.fileMiB, fileMiB), (.relayMiB, relayMiB),
                (.requests, requests),
            ]
            for (key, value) in counts { try container.encode(value, forKey: key) }
            if let vethTCPMBs, let vethTCPRTTMs {
                try container.encode(rounded(vethTCPMBs), forKey: .vethTCPMBs)
                try container.encode(rounded(vethTCPRTTMs), forKey: .vethTCPRTTMs)
                try container.encode(rounded(tcpRTTMs - vethTCPRTTMs), forKey: .wireAddedRTTMs)
            }
        }
    }

    func run() async throws {
        let linkProfile = try link.resolved()
        let lab = try NetLab(hostCount: 2, profile: linkProfile, seed: seed ?? UInt64.random(in: 0...UInt64.max))
        // Nodes running now, stopped by a signal too (a deleted namespace does not end its processes).
        let running = NIOLockedValueBox<[BenchNodePair]>([])
        let guardian = NetLabSignalGuard {
            for pair in running.withLockedValue({ $0 }) { pair.stop() }
            lab.close()
        }
        defer {
            guardian.cancel()
            lab.close()
        }
        let hosts = lab.hosts.map { (namespace: $0.namespace, interface: $0.interface) }
        // Host a's address now (a roaming profile changes it later: the reference is measured first).
        let serverAddress = lab.address(ofHost: 0).split(separator: ".").reduce(UInt32(0)) { $0 << 8 | (UInt32($1) ?? 0) }
        let app = try lab.inHost(0) { try RelayBenchApp(anyAddress: true) }
        defer { app.stop() }
        let warmUp = max(1, requests / 10)

        // The reference: plain TCP across the link, from host b to the app in host a.
        let tcp = try lab.inHost(1) { try RelayBenchApp.transfer(host: serverAddress, port: app.port, bytes: tcpMib << 20, streams: 1) }
        let tcpTimes = try lab.inHost(1) {
            try RelayBenchApp.roundTrips(host: serverAddress, port: app.port, responseBytes: Self.responseBytes,
                                         requests: requests, warmUp: warmUp).sortedMs
        }
        var figures = Figures(profile: linkProfile.name, tcpMBs: tcp.megabytesPerSecond, tcpRTTMs: Self.median(tcpTimes),
                              tcpRTTP99Ms: Self.percentile(tcpTimes, 0.99), texts: texts, lostItems: 0, duplicatedItems: 0,
                              wireDroppedFrames: 0, wireOutages: 0, tcpMiB: tcpMib, fileMiB: fileMib, relayMiB: relayMib,
                              requests: requests)

        // Texts from a start, then relay mode on the same nodes.
        try await measureTextsAndRelay(hosts: hosts, lab: lab, appPort: app.port, warmUp: warmUp, running: running, into: &figures)
        // A file, with fresh nodes so that it does not share the link with anything else.
        if fileMib > 0 { try await measureFile(hosts: hosts, running: running, into: &figures) }
        let tcpMBs = figures.tcpMBs
        figures.fileTCPRatio = figures.fileMBs.map { $0 / tcpMBs }
        if vethReference {
            let veth = try VethReference(warmUp: warmUp, bench: self)
            (figures.vethTCPMBs, figures.vethTCPRTTMs) = (veth.megabytesPerSecond, veth.medianRTTMs)
        }
        let counters = lab.counters
        figures.wireDroppedFrames = counters.droppedTotal
        figures.wireOutages = lab.outages
        figures.addressChanges = lab.addressChanges.count
        report(figures)
    }

    private func measureTextsAndRelay(hosts: [(namespace: String, interface: String)], lab: NetLab, appPort: Int, warmUp: Int,
                                      running: NIOLockedValueBox<[BenchNodePair]>, into figures: inout Figures) async throws {
        let pair = try BenchNodePair(label: "links")
        running.withLockedValue { $0 = [pair] }
        defer {
            pair.stop()
            running.withLockedValue { $0 = [] }
        }
        let expiry = Date().addingTimeInterval(3600)
        let sender = try NodeStore(home: pair.homes[0])
        var expected = Set<UUID>()
        for index in 0..<texts {
            expected.insert(try sender.enqueueText("text \(index) over \(link.profile)", to: BenchNodePair.names[1], expiresAt: expiry).id)
        }
        let marks = NIOLockedValueBox(TextMarks())
        let started = ContinuousClock.now
        try pair.start(arguments: ["--app-port", String(appPort)], hosts: hosts) { name, record in
            let event = record["event"] as? String
            marks.withLockedValue { marks in
                if name == "a", event == "offered", marks.firstOffered == nil { marks.firstOffered = .now }
                if name == "b", event == "received", let id = (record["id"] as? String).flatMap(UUID.init(uuidString:)) {
                    marks.received.append((id, .now))
                }
                if name == "b", event == "relay_listening", record["contact"] as? String == "a", let port = record["port"] as? Int {
                    marks.relayPort = port
                }
                if name == "a", event == "advertising" { marks.advertised.append(.now) }
                if name == "b", event == "matched", record["contact"] as? String == "a" { marks.matched.append(.now) }
                if name == "a", event == "delivered", let id = (record["id"] as? String).flatMap(UUID.init(uuidString:)), marks.delivered[id] == nil {
                    marks.delivered[id] = .now
                }
            }
        }
        _ = await pair.wait(seconds: timeout) { marks.withLockedValue { Set($0.received.map(\.id)).isSuperset(of: expected) ? true : nil } }
        let textMarks = marks.withLockedValue { $0 }
        if let first = textMarks.received.first {
            figures.firstDeliverySeconds = (first.at - started).seconds
            if let last = textMarks.received.last, let offered = textMarks.firstOffered, last.at > offered {
                figures.textsPerSecond = Double(textMarks.received.count) / (last.at - offered).seconds
            }
        }

        if relayMib > 0, let relayPort = await pair.wait(seconds: timeout, for: { marks.withLockedValue { $0.relayPort } }) {
            // The app's client in host b, through b's relay port, the link, and node a to the app in host a.
            let times = try lab.inHost(1) {
                try RelayBenchApp.roundTrips(port: relayPort, responseBytes: Self.responseBytes, requests: requests, warmUp: warmUp).sortedMs
            }
            figures.relayRTTMs = Self.median(times)
            figures.relayRTTP99Ms = Self.percentile(times, 0.99)
            figures.relayMBs = try lab.inHost(1) {
                try RelayBenchApp.transfer(port: relayPort, bytes: relayMib << 20, streams: 1).megabytesPerSecond
            }
        }
        if textRequests > 0 { try await measureTextRoundTrips(pair: pair, marks: marks, expected: &expected, into: &figures) }
        pair.stopNodes()
        let (lost, duplicated) = try Self.tally(expected: expected, inbox: NodeStore(home: pair.homes[1]).inbox())
        figures.lostItems += lost
        figures.duplicatedItems += duplicated
    }

    private func measureFile(hosts: [(namespace: String, interface: String)], running: NIOLockedValueBox<[BenchNodePair]>,
                             into figures: inout Figures) async throws {
        let pair = try BenchNodePair(label: "links-file")
        running.withLockedValue { $0 = [pair] }
        defer {
            pair.stop()
            running.withLockedValue { $0 = [] }
        }
        let source = pair.root + "/payload.bin"
        let block = Data((0..<(1 << 20)).map { UInt8(truncatingIfNeeded: ($0 &* 2654435761) >> 11) })
        _ = try BenchDelivery.writeAndSync(block, bytes: fileMib << 20, to: source)
        let item = try NodeStore(home: pair.homes[0]).enqueueFile(at: source, to: BenchNodePair.names[1],
                                                                  expiresAt: Date().addingTimeInterval(3600))
        let marks = NIOLockedValueBox<(offered: ContinuousClock.Instant?, received: ContinuousClock.Instant?)>((nil, nil))
        let starts = NIOLockedValueBox<[Int]>([])  // b's transfer_started offsets for the file
        try pair.start(arguments: [], hosts: hosts) { name, record in
            let event = record["event"] as? String
            guard record["id"] as? String == item.id.uuidString else { return }
            marks.withLockedValue { marks in
                if name == "a", event == "offered", marks.offered == nil { marks.offered = .now }
                if name == "b", event == "received", marks.received == nil { marks.received = .now }
            }
            if name == "b", event == "transfer_started", let offset = record["offset"] as? Int {
                starts.withLockedValue { $0.append(offset) }
            }
        }
        let done = await pair.wait(seconds: timeout) { () -> (ContinuousClock.Instant, ContinuousClock.Instant)? in
            let (offered, received) = marks.withLockedValue { $0 }
            guard let offered, let received else { return nil }
            return (offered, received)
        }
        pair.stopNodes()
        let offsets = starts.withLockedValue { $0 }
        figures.fileResumes = offsets.dropFirst().filter { $0 > 0 }.count
        figures.fileRestarts = offsets.dropFirst().filter { $0 == 0 }.count
        let inbox = try NodeStore(home: pair.homes[1]).inbox()
        let (lost, duplicated) = Self.tally(expected: [item.id], inbox: inbox)
        figures.lostItems += lost
        figures.duplicatedItems += duplicated
        guard let (offered, received) = done else { return }
        // The bytes, not only the item: the received file equals the one sent.
        if let path = inbox.first(where: { $0.itemID == item.id })?.filePath,
           FileManager.default.contentsEqual(atPath: path, andPath: source) {
            figures.fileSeconds = (received - offered).seconds
            figures.fileMBs = Double(fileMib << 20) / (received - offered).seconds / 1_000_000
        } else {
            figures.lostItems += 1  // arrived, but not intact
        }
    }

    /// Texts sent one at a time to the running nodes (`--text-requests`), as a user sends them: each with
    /// `thali-node send` on a's data directory, and the next once a reported the previous one `delivered`
    /// (the receiver stored it) and a random pause of up to one outbox poll interval has passed. The round trip runs from the `send` process's exit (the item is committed
    /// to a's store) to that `delivered`: it holds a's outbox poll (`send` is another process; the node
    /// reads the store every `PeerConfiguration.outboxPollInterval`), the announcement, b's match and the
    /// delivery over the session the relay keeps open, but not the `send` process's own start and run,
    /// which is measured apart (`text_send_ms`). a's `advertising` line splits the round trip into the poll
    /// (`text_notice_ms`) and what follows on the link (`text_announced_rtt_ms`), and b's `matched` line the
    /// delivery exchange over the open session (`text_matched_rtt_ms`) from the announcement reaching b. A
    /// text with no announcement before its delivery went on a delivery session that lingered (version 5)
    /// and counts in `text_unannounced_count` instead.
    private func measureTextRoundTrips(pair: BenchNodePair, marks: NIOLockedValueBox<TextMarks>, expected: inout Set<UUID>,
                                       into figures: inout Figures) async throws {
        let executable = try SpawnedPeer.ownExecutable()
        var (sendMs, roundTripMs, noticeMs, announcedMs, matchedMs) = ([Double](), [Double](), [Double](), [Double](), [Double]())
        figures.textRequests = textRequests
        // A send right after the previous delivery would fall at the same point of a's poll cycle each time
        // (just after the poll that found the previous text): a pause drawn over one poll interval spreads
        // the sends over the cycle, as a user's sends are.
        let pollMs = Int(PeerConfiguration(interfaceAddress: "127.0.0.1").outboxPollInterval.seconds * 1000)
        for index in 0..<textRequests {
            try await Task.sleep(for: .milliseconds(Int.random(in: 0..<max(1, pollMs))))
            let before = ContinuousClock.now
            let arguments = ["send", "--home", pair.homes[0].path, "--json", BenchNodePair.names[1], "round trip \(index) over \(link.profile)"]
            let result = try ChildProcess.run(executable, arguments, timeout: .seconds(30))
            let queued = ContinuousClock.now
            guard result.status == 0, let id = Self.queuedID(result.output) else {
                throw ValidationError("thali-node send failed (\(result.status)): \(result.output)")
            }
            expected.insert(id)
            guard let delivered = await pair.wait(seconds: timeout, for: { marks.withLockedValue { $0.delivered[id] } }) else { break }
            sendMs.append((queued - before).seconds * 1000)
            roundTripMs.append((delivered - queued).seconds * 1000)
            // The announcement this item caused: the first after its send began (the poll may fall before the
            // process has exited).
            if let announced = marks.withLockedValue({ $0.advertised.first { $0 > before } }), announced <= delivered {
                noticeMs.append(max(0, (announced - queued).seconds * 1000))
                announcedMs.append((delivered - announced).seconds * 1000)
                if let matched = marks.withLockedValue({ $0.matched.first { $0 >= announced } }), matched <= delivered {
                    matchedMs.append((delivered - matched).seconds * 1000)
                }
            } else {
                // No announcement in between: it went on a delivery session that lingered (version 5).
                figures.textUnannouncedCount += 1
            }
            marks.withLockedValue {
                $0.advertised.removeAll()
                $0.matched.removeAll()
            }
        }
        figures.textRTTCount = roundTripMs.count
        guard !roundTripMs.isEmpty else { return }
        let sorted = roundTripMs.sorted()
        figures.textRTTMs = Self.median(sorted)
        figures.textRTTP99Ms = Self.percentile(sorted, 0.99)
        figures.textSendMs = Self.median(sendMs.sorted())
        if !noticeMs.isEmpty {
            figures.textNoticeMs = Self.median(noticeMs.sorted())
            figures.textAnnouncedRTTMs = Self.median(announcedMs.sorted())
        }
        if !matchedMs.isEmpty { figures.textMatchedRTTMs = Self.median(matchedMs.sorted()) }
    }

    /// The item id in `thali-node send --json`'s output: one JSON object, over several lines.
    static func queuedID(_ output: String) -> UUID? {
        guard let start = output.firstIndex(of: "{"), let end = output.lastIndex(of: "}"), start < end,
              let object = try? JSONSerialization.jsonObject(with: Data(output[start...end].utf8)) as? [String: Any] else { return nil }
        return (object["id"] as? String).flatMap(UUID.init(uuidString:))
    }

    /// When the texts were first offered and received, where b's relay to a listens, when a announced
    /// (since the last text sent one at a time), and when a learned
    /// each item was delivered.
    private struct TextMarks {
        var firstOffered: ContinuousClock.Instant?
        var received: [(id: UUID, at: ContinuousClock.Instant)] = []
        var relayPort: Int?
        var advertised: [ContinuousClock.Instant] = []
        var matched: [ContinuousClock.Instant] = []
        var delivered: [UUID: ContinuousClock.Instant] = [:]
    }

    /// Items of `expected` missing from `inbox`, and extra copies of any item in it.
    static func tally(expected: Set<UUID>, inbox: [InboxItem]) -> (lost: Int, duplicated: Int) {
        let ids = inbox.map(\.itemID)
        return (expected.subtracting(ids).count, ids.count - Set(ids).count)
    }

    static func median(_ sorted: [Double]) -> Double { sorted.isEmpty ? 0 : sorted[sorted.count / 2] }

    static func percentile(_ sorted: [Double], _ fraction: Double) -> Double {
        sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int((Double(sorted.count) * fraction).rounded(.up)) - 1)]
    }

    private func report(_ figures: Figures) {
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            if let data = try? encoder.encode(figures) { print(String(decoding: data, as: UTF8.self)) }
            return
        }
        func text(_ value: Double?, _ format: String = "%.2f") -> String { value.map { String(format: format, $0) } ?? "-" }
        print("links over \(figures.profile): plain TCP \(text(figures.tcpMBs)) MB/s, \(Self.responseBytes)-byte round trip "
            + "median \(text(figures.tcpRTTMs)) ms, p99 \(text(figures.tcpRTTP99Ms)) ms")
        print("  file of \(fileMib) MiB: \(text(figures.fileMBs)) MB/s (\(text(figures.fileTCPRatio)) of TCP), "
            + "resumed \(figures.fileResumes) times, restarted \(figures.fileRestarts)")
        print("  \(texts) texts: first delivery \(text(figures.firstDeliverySeconds)) s after start, \(text(figures.textsPerSecond, "%.1f")) texts/s")
        print("  relay: \(text(figures.relayMBs)) MB/s, round trip median \(text(figures.relayRTTMs)) ms, p99 \(text(figures.relayRTTP99Ms)) ms")
        if figures.textRequests > 0 {
            print("  \(figures.textRTTCount) of \(figures.textRequests) texts sent one at a time: round trip (send's exit to delivered) "
                + "median \(text(figures.textRTTMs)) ms, p99 \(text(figures.textRTTP99Ms)) ms; of it the outbox poll "
                + "\(text(figures.textNoticeMs)) ms, after the announcement \(text(figures.textAnnouncedRTTMs)) ms, after b's match "
                + "\(text(figures.textMatchedRTTMs)) ms; "
                + "the send process \(text(figures.textSendMs)) ms; "
                + "\(figures.textUnannouncedCount) went on a lingering session, unannounced")
        }
        if let vethRTT = figures.vethTCPRTTMs {
            print("  bare veth reference: plain TCP \(text(figures.vethTCPMBs)) MB/s, round trip median \(text(vethRTT, "%.3f")) ms; "
                + "the wire adds \(text(figures.tcpRTTMs - vethRTT, "%.3f")) ms to a round trip")
        }
        print("  items lost \(figures.lostItems), duplicated \(figures.duplicatedItems); wire dropped \(figures.wireDroppedFrames) frames, "
            + "\(figures.wireOutages) outages, \(figures.addressChanges) address changes")
    }
}

/// Plain TCP between two namespaces joined by a bare veth pair (no wire, no TAP): the reference the
/// wire is measured against (``BenchLinks/vethReference``), with an app of its own in the first
/// namespace; the namespaces are deleted before this returns.
struct VethReference {
    var megabytesPerSecond: Double
    var medianRTTMs: Double

    init(warmUp: Int, bench: BenchLinks) throws {
        let names = ["a", "b"].map { "\(NetLab.namePrefix)\(getpid())-veth\($0)" }
        defer { for name in names { _ = try? Self.ip(["netns", "del", name]) } }
        for name in names { try Self.ip(["netns", "add", name]) }
        try Self.ip(["link", "add", "tlabveth\(getpid() % 100_000)", "netns", names[0], "type", "veth", "peer", "name", "eth0", "netns", names[1]])
        try Self.ip(["-n", names[0], "link", "set", "tlabveth\(getpid() % 100_000)", "name", "eth0"])
        for (index, name) in names.enumerated() {
            try Self.ip(["-n", name, "addr", "add", "\(NetLab.subnet).\(index + 1)/24", "dev", "eth0"])
            try Self.ip(["-n", name, "link", "set", "eth0", "up"])
            try Self.ip(["-n", name, "link", "set", "lo", "up"])
        }
        let app = try NetLab.withNetworkNamespace(named: names[0]) { try RelayBenchApp(anyAddress: true) }
        defer { app.stop() }
        let server: UInt32 = 0x0A4D_0001
        let bulk = try NetLab.withNetworkNamespace(named: names[1]) {
            try RelayBenchApp.transfer(host: server, port: app.port, bytes: bench.tcpMib << 20, streams: 1)
        }
        let times = try NetLab.withNetworkNamespace(named: names[1]) {
            try RelayBenchApp.roundTrips(host: server, port: app.port, responseBytes: BenchLinks.responseBytes,
                                         requests: bench.requests, warmUp: warmUp).sortedMs
        }
        megabytesPerSecond = bulk.megabytesPerSecond
        medianRTTMs = BenchLinks.median(times)
    }

    @discardableResult
    private static func ip(_ arguments: [String]) throws -> String {
        let result = try ChildProcess.run("ip", arguments, timeout: .seconds(10))
        guard result.status == 0 else { throw ValidationError("ip \(arguments.joined(separator: " ")) failed: \(result.output)") }
        return result.output
    }
}

/// Runs `cleanUp` and exits when SIGINT, SIGTERM or SIGHUP arrives while it is held, so that a lab is
/// deleted however the benchmark is stopped (the nodes, children of ours, see their input close and stop).
final class NetLabSignalGuard: @unchecked Sendable {
    private let sources: [DispatchSourceSignal]

    init(_ cleanUp: @escaping @Sendable () -> Void) {
        sources = [SIGINT, SIGTERM, SIGHUP].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                cleanUp()
                exit(128 + number)
            }
            source.resume()
            return source
        }
    }

    /// Stops handling the signals (their default action is back).
    func cancel() {
        for source in sources { source.cancel() }
        for number in [SIGINT, SIGTERM, SIGHUP] { signal(number, SIG_DFL) }
    }
}
