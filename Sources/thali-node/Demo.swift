import ArgumentParser
import Crypto
import Foundation
import ThaliBeacons
import ThaliNodeCore
import ThaliProcess

/// `thali-node demo`: the README's first command. Three peers (Alice, Bob, Carol) run as real
/// `thali-node run` processes on this machine — multicast on loopback with the interface pinned, no root —
/// with identities, mutual contacts, and messages and a file queued among them. The demo shows the
/// discovery, the beacon matches, the PSK-TLS sessions and the deliveries live, ends by itself when every
/// item arrived, stops the peers cleanly, checks that each inbox holds exactly what was meant for it, and
/// prints how long each step took.
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run three peers on this machine that find each other and deliver messages and a file privately.")

    @Option(help: "Give up (exit non-zero) if not everything is delivered within this many seconds.")
    var timeout: Double = 60
    @Option(help: "Size of the file Alice sends Carol (Bob, when Carol stays home), in bytes.")
    var fileSize: Int = 256 * 1024
    @Option(help: "Pace Alice's sending at this many bytes per second so the file's progress can be watched (0: full speed).")
    var pace: Int = 256 * 1024
    @Flag(help: "Keep the peers' data directories (their paths are printed).")
    var keep = false
    @Flag(help: "Bluetooth only (no SSDP): each peer on its own adapter (see --adapters); scripts/bt-vm/demo.sh runs this in a guest with real BlueZ.")
    var bluetooth = false
    @Option(help: ArgumentHelp("With --bluetooth: the adapters of Alice and Bob, and Carol's if a third is named (two adapters: Carol stays home).",
                               valueName: "a,b[,c]"))
    var adapters = "hci0,hci1,hci2"
    @Flag(help: """
        Print only the summary, as one JSON object: ok, items, verified, peers (name, inbox, outbox_left), \
        timings (step, s), pace_bytes_per_s, failure (when it failed), kept_under (with --keep).
        """)
    var json = false

    /// The end of a demo run, as `--json` prints it (the same as the readable summary and timings).
    struct Summary: Encodable {
        struct Peer: Encodable {
            var name: String
            var inbox: Int
            var outboxLeft: Int

            enum CodingKeys: String, CodingKey {
                case name, inbox
                case outboxLeft = "outbox_left"
            }
        }

        struct Step: Encodable {
            var step: String
            var s: Double
        }

        var ok: Bool
        var items: Int
        var verified: Int
        var peers: [Peer]
        var timings: [Step]
        var paceBytesPerSecond: Int
        var failure: String?
        var keptUnder: String?

        enum CodingKeys: String, CodingKey {
            case ok, items, verified, peers, timings, failure
            case paceBytesPerSecond = "pace_bytes_per_s"
            case keptUnder = "kept_under"
        }
    }

    /// A readable line; nothing with `--json` (only the summary object is printed).
    private func say(_ line: String) {
        if !json { print(line) }
    }

    func validate() throws {
        guard timeout > 0, (1...(64 << 20)).contains(fileSize), pace >= 0 else {
            throw ValidationError("--timeout must be positive, --file-size 1 byte to 64 MiB, --pace not negative")
        }
        if bluetooth && !(2...3).contains(adapterList.count) {
            throw ValidationError("--adapters names two or three adapters, one per peer")
        }
    }

    private var adapterList: [String] { adapters.split(separator: ",").map(String.init) }

    struct Person {
        let name: String
        let home: NodeHome
        let key: PrivateKey
        let store: NodeStore
    }

    struct Expected {
        let id: UUID
        let from: String
        let to: String
        let what: String
        let sha256: Data
    }

    func run() async throws {
        let executable = try SpawnedPeer.ownExecutable()
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("thali-demo-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer {
            if keep { say("\nData directories kept under \(root)") } else { try? FileManager.default.removeItem(atPath: root) }
        }
        let clock = ContinuousClock()
        let setupStart = clock.now

        // Three people (over Bluetooth, one per adapter), each with an identity and the others as contacts.
        let names = ["Alice", "Bob", "Carol"].prefix(bluetooth ? adapterList.count : 3)
        let people = try names.map { name -> Person in
            let home = NodeHome(path: root + "/" + name.lowercased())
            try home.create()
            let key = try NodeIdentity.create(in: home)
            return Person(name: name, home: home, key: key, store: try NodeStore(home: home))
        }
        for person in people {
            for other in people where other.name != person.name {
                try person.store.addContact(name: other.name.lowercased(), publicKey: other.key.publicKey.hexString(compressed: true))
            }
        }
        let (alice, bob, carol) = (people[0], people[1], people.count > 2 ? people[2] : nil)
        let expiry = Date().addingTimeInterval(3600)
        var expected: [Expected] = []
        func text(_ text: String, from: Person?, to: Person?) throws {
            guard let from, let to else { return }
            let item = try from.store.enqueueText(text, to: to.name.lowercased(), expiresAt: expiry)
            expected.append(Expected(id: item.id, from: from.name, to: to.name, what: "text \"\(text)\"", sha256: item.sha256))
        }
        try text("Hi Bob, lunch at noon?", from: alice, to: bob)
        try text("Carol, the slides are ready.", from: alice, to: carol)
        try text("Alice: yes, noon works.", from: bob, to: alice)
        try text("Thanks Alice!", from: carol, to: alice)
        try text("Bob, see you at the meeting.", from: carol, to: bob)
        let filePath = root + "/holiday-photo.jpg"
        var bytes = [UInt8](repeating: 0, count: fileSize)
        for index in bytes.indices { bytes[index] = UInt8(truncatingIfNeeded: index &* 2654435761 >> 13) }
        try Data(bytes).write(to: URL(fileURLWithPath: filePath))
        let fileRecipient = carol ?? bob
        let file = try alice.store.enqueueFile(at: filePath, to: fileRecipient.name.lowercased(), expiresAt: expiry)
        expected.append(Expected(id: file.id, from: "Alice", to: fileRecipient.name, what: "file holiday-photo.jpg (\(fileSize) bytes)",
                                 sha256: file.sha256))
        let setupTime = clock.now - setupStart

        if bluetooth {
            say("Thali demo: \(people.count == 3 ? "three" : "two") peers on Bluetooth adapters \(adapterList.joined(separator: ", ")) find each other with BLE and private beacons, then deliver over RFCOMM and PSK-TLS\n")
        } else {
            say("Thali demo: three peers on 127.0.0.1 find each other with SSDP and private beacons, then deliver over PSK-TLS\n")
        }
        for person in people {
            say("  \(pad(person.name, 6)) \(person.key.publicKey.hexString(compressed: true))")
        }
        say("\nQueued:")
        for item in expected { say("  \(pad(item.from, 6)) → \(pad(item.to, 6)) \(item.what)") }
        say("")

        // The peers: real processes, multicast pinned to loopback on a random port.
        let ssdpPort = Int.random(in: 20000...60000)
        let (events, sink) = AsyncStream.makeStream(of: DemoEvent.self)
        var peers: [SpawnedPeer] = []
        defer { for peer in peers { peer.terminate(grace: 2) } }
        let start = clock.now
        for (index, person) in people.enumerated() {
            var arguments = ["run", "--home", person.home.path, "--json", "--per-source-limit", "1000"]
            if bluetooth {
                arguments += ["--bluetooth", "--adapter", adapterList[index], "--no-wifi"]
            } else {
                arguments += ["--address", "127.0.0.1", "--ssdp-port", String(ssdpPort), "--max-age", "5"]
            }
            if pace > 0 { arguments += ["--throttle", String(pace)] }
            let name = person.name
            peers.append(try SpawnedPeer(name: name, executable: executable, arguments: arguments,
                                         stderrPath: person.home.path + "/run.log") { line in
                // A line that is no event (none is expected) is skipped: the end checks the inboxes themselves.
                if let event = try? NodeEvent(jsonLine: Data(line.utf8)) { sink.yield(.peer(name, event)) }
            })
        }
        let deadline = Task {
            try? await Task.sleep(for: .seconds(timeout))
            sink.yield(.timeout)
        }
        defer { deadline.cancel() }
        let running = peers
        let watchdog = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(200))
                if let dead = running.first(where: { $0.hasExited }) {
                    sink.yield(.exited(dead.name))
                }
            }
        }
        defer { watchdog.cancel() }

        var timings: [(String, Duration)] = [("set up \(people.count) identities, contacts, \(expected.count) items", setupTime)]
        var firstSeen: [String: Duration] = [:]
        var firstMatch: Duration?
        var received: [UUID: Duration] = [:]
        var delivered = Set<UUID>()
        var failure: String?
        let byID = Dictionary(uniqueKeysWithValues: expected.map { ($0.id, $0) })
        for await item in events {
            let elapsed = clock.now - start
            switch item {
            case .timeout:
                failure = "not everything was delivered within \(timeout) s"
            case .exited(let person):
                failure = "\(person)'s peer exited early; see \(root)/\(person.lowercased())/run.log"
            case .peer(let person, let event):
                let stamp = String(format: "+%6.2fs", seconds(elapsed))
                let who = pad(person, 6)
                let contact = event.contact.map { $0.name.prefix(1).uppercased() + $0.name.dropFirst() } ?? "?"
                switch event {
                case .started(let location):
                    say("\(stamp)  \(who) listening at \(location)")
                case .advertising(let contacts) where !contacts.isEmpty:
                    say("\(stamp)  \(who) advertises beacons for \(contacts.joined(separator: ", "))")
                case .peerAppeared(let location):
                    if firstSeen[person] == nil { firstSeen[person] = elapsed }
                    say("\(stamp)  \(who) hears a peer at \(location)")
                case .beaconMatched:
                    if firstMatch == nil { firstMatch = elapsed }
                    say("\(stamp)  \(who) finds a beacon for it from \(contact)")
                case .connected(_, .connecting, _, _):
                    say("\(stamp)  \(who) PSK-TLS session with \(contact) authenticated")
                case .delivery(_, .progress(let id, let bytes, let total))
                    where byID[id]?.what.hasPrefix("file") == true && person == fileRecipient.name:
                    say("\(stamp)  \(who) receiving the file from \(contact): \(bytes)/\(total) bytes (\(total == 0 ? 100 : bytes * 100 / total) %)")
                case .delivery(_, .received(let arrived)):
                    guard let item = byID[arrived.id] else {
                        failure = "\(person) received an item nobody queued for it"
                        break
                    }
                    if item.to != person { failure = "\(person) received an item meant for \(item.to)" }
                    received[arrived.id] = received[arrived.id] ?? elapsed
                    say("\(stamp)  \(who) received from \(contact): \(item.what)")
                case .delivery(_, .delivered(let id, _)):
                    // The sender's side of the same item: its outbox is empty only once the ack came.
                    delivered.insert(id)
                case .connectionFailed(_, let reason, _):
                    say("\(stamp)  \(who) connection with \(contact) failed (\(reason)), retrying")
                default:
                    break
                }
            }
            // Every item in its inbox and out of its sender's outbox: stopping earlier leaves an item whose
            // ack was still on its way in the sender's outbox (delivered again, as `complete`, next time).
            if failure != nil || (received.count == expected.count && delivered.count == expected.count) { break }
        }
        sink.finish()

        // Stop the peers cleanly (SIGTERM: byebye, connections closed, exit 0).
        let stopStart = clock.now
        var exitCodes: [String: Int32] = [:]
        for peer in peers { exitCodes[peer.name] = peer.terminate(grace: 10) }
        let stopTime = clock.now - stopStart
        if failure == nil, let bad = exitCodes.first(where: { $0.value != 0 }) {
            failure = "\(bad.key)'s peer exited with status \(bad.value)"
        }

        // Each inbox holds exactly what was meant for it, once, intact.
        var verified = 0
        for person in people {
            let inbox = try person.store.inbox()
            let meant = expected.filter { $0.to == person.name }
            let senders = Dictionary(uniqueKeysWithValues: people.map { ($0.key.publicKey.hexString(compressed: true), $0.name) })
            for item in inbox {
                guard let want = meant.first(where: { $0.id == item.itemID }), senders[item.fromPublicKey] == want.from,
                      item.sha256 == want.sha256 else {
                    failure = failure ?? "\(person.name)'s inbox holds an unexpected item \(item.itemID)"
                    continue
                }
                if let path = item.filePath {
                    let digest = Data(SHA256.hash(data: try Data(contentsOf: URL(fileURLWithPath: path))))
                    if digest != want.sha256 { failure = failure ?? "\(person.name)'s copy of \(want.what) is damaged" }
                }
                verified += 1
            }
            if inbox.count != meant.count || Set(inbox.map(\.itemID)).count != inbox.count {
                failure = failure ?? "\(person.name)'s inbox holds \(inbox.count) items, expected \(meant.count) once each"
            }
        }

        say("\nSummary")
        for person in people {
            let inbox = (try? person.store.inbox()) ?? []
            say("  \(pad(person.name, 6)) inbox: \(inbox.count) item(s), outbox left: \((try? person.store.outbox().count) ?? -1)")
        }
        say("  \(verified) of \(expected.count) items verified in the right inbox, exactly once, content intact; nobody got another's item"
              + (verified == expected.count && failure == nil ? "" : " — FAILED"))
        say("\nTimings (from the peers' start)")
        for person in people {
            if let seen = firstSeen[person.name] { timings.append(("\(person.name) discovers a first peer", seen)) }
        }
        if let firstMatch { timings.append(("first beacon matched", firstMatch)) }
        for item in expected {
            if let at = received[item.id] { timings.append(("\(item.from) → \(item.to): \(item.what)", at)) }
        }
        timings.append(("stop the \(people.count) peers cleanly (SIGTERM: byebye, exit 0)", stopTime))
        for (name, duration) in timings {
            say("  \(pad(name, 62)) \(String(format: "%8.3f s", seconds(duration)))")
        }
        if pace > 0 { say("  (sending is paced at \(pace) bytes/s per stream so the file's progress is visible; --pace 0 for full speed)") }
        if json {
            let peers = people.map { person in
                Summary.Peer(name: person.name, inbox: (try? person.store.inbox().count) ?? -1,
                             outboxLeft: (try? person.store.outbox().count) ?? -1)
            }
            let summary = Summary(ok: verified == expected.count && failure == nil, items: expected.count, verified: verified,
                                  peers: peers, timings: timings.map { Summary.Step(step: $0.0, s: seconds($0.1)) },
                                  paceBytesPerSecond: pace, failure: failure, keptUnder: keep ? root : nil)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            print(String(decoding: try encoder.encode(summary), as: UTF8.self))
        }
        if let failure {
            say("\nDemo FAILED: \(failure)")
            throw ExitCode.failure
        }
        say("\nEvery item reached its contact, and only its contact.")
    }
}

/// What the demo watches: a peer's event line, the deadline, a peer that exited early.
enum DemoEvent: Sendable {
    /// An event line the peer of this person printed.
    case peer(String, NodeEvent)
    /// `--timeout` passed.
    case timeout
    /// This person's peer exited before the demo stopped it.
    case exited(String)
}

private func pad(_ text: String, _ width: Int) -> String { text.padding(toLength: max(width, text.count), withPad: " ", startingAt: 0) }
private func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}
