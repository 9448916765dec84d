import Foundation
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// `ip` for the namespace tests, if present.
private let ipTool: String? = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first { FileManager.default.isExecutableFile(atPath: $0) }


/// Three hosts: network namespaces whose `eth0`s are veth ends on a bridge in a fourth namespace.
/// Addresses exist only inside them; deinit deletes all four (and with them every link).
private final class ThreeHosts: @unchecked Sendable {
    let names: [String]
    let bridge: String
    let addresses = ["10.217.9.1", "10.217.9.2", "10.217.9.3"]

    init(prefix: String) throws {
        bridge = prefix + "br"
        names = (0..<3).map { "\(prefix)h\($0)" }
        for name in [bridge] + names {
            _ = try? Self.ip(["netns", "del", name])  // a leftover of a crashed run with the same pid
        }
        do {
            for name in [bridge] + names {
                try Self.ip(["netns", "add", name])
                try Self.ip(["netns", "exec", name, ipTool ?? "ip", "link", "set", "lo", "up"])
            }
            try Self.ip(["netns", "exec", bridge, ipTool ?? "ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"])
            try Self.ip(["netns", "exec", bridge, ipTool ?? "ip", "link", "set", "br0", "up"])
            for (index, name) in names.enumerated() {
                try Self.ip(["netns", "exec", bridge, ipTool ?? "ip", "link", "add", "v\(index)", "type", "veth", "peer", "name", "eth0", "netns", name])
                try Self.ip(["netns", "exec", bridge, ipTool ?? "ip", "link", "set", "v\(index)", "master", "br0", "up"])
                try Self.ip(["netns", "exec", name, ipTool ?? "ip", "addr", "add", "\(addresses[index])/24", "dev", "eth0"])
                try Self.ip(["netns", "exec", name, ipTool ?? "ip", "link", "set", "eth0", "up"])
            }
        } catch {
            deleteAll()
            throw error
        }
    }

    deinit { deleteAll() }

    private func deleteAll() {
        for name in [bridge] + names { _ = try? Self.ip(["netns", "del", name]) }
    }

    @discardableResult
    static func ip(_ arguments: [String]) throws -> String {
        let result = try ChildProcess.run(ipTool ?? "ip", arguments, timeout: .seconds(10))
        guard result.status == 0 else {
            throw IPCommandFailure(description: "ip \(arguments.joined(separator: " ")): \(result.output)")
        }
        return result.output
    }

    /// `thali-node run` inside host `index`.
    func run(_ index: Int, _ arguments: [String], label: String) throws -> RunningPeer {
        try RunningPeer(label, ipTool ?? "ip", ["netns", "exec", names[index], thaliNodeExecutable] + arguments)
    }
}

/// The issue's proof: three hosts, three real `thali-node run` processes, messages and files reach the
/// right contacts and only them; a sender and a receiver killed with SIGKILL mid-file and restarted still
/// end with exactly one copy of every item.
@Suite("Delivery across three hosts", .serialized)
struct ThreeHostDeliveryTests {
    @Test(.enabled(if: TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces)), .timeLimit(.minutes(2)))
    func threeHostsDeliverAndSurviveSIGKILL() async throws {
        let hosts = try ThreeHosts(prefix: "tnode\(getpid())")
        let people = try TestPeople(["alice", "bob", "carol"], label: "3h")
        let (alice, bob, carol) = (try people["alice"], try people["bob"], try people["carol"])
        let expiry = Date().addingTimeInterval(600)
        func file(_ name: String, of person: TestPeople.Person, size: Int) throws -> (String, Data) {
            let path = person.home.path + "/" + name
            let data = Data(randomBytes(size))
            try data.write(to: URL(fileURLWithPath: path))
            return (path, data)
        }
        // Each file takes about 2 s at the throttle below, so the kills land mid-transfer.
        let fileSize = 1_000_000, throttle = 500_000
        let (photoPath, photo) = try file("photo.jpg", of: alice, size: fileSize)
        let (reportPath, report) = try file("report.pdf", of: alice, size: fileSize)
        var expected: [String: Set<UUID>] = ["alice": [], "bob": [], "carol": []]
        expected["bob"]!.insert(try alice.store.enqueueText("for bob only", to: "bob", expiresAt: expiry).id)
        expected["carol"]!.insert(try alice.store.enqueueText("for carol only", to: "carol", expiresAt: expiry).id)
        let toCarol = try alice.store.enqueueFile(at: photoPath, to: "carol", expiresAt: expiry)
        expected["carol"]!.insert(toCarol.id)
        let toBob = try alice.store.enqueueFile(at: reportPath, to: "bob", expiresAt: expiry)
        expected["bob"]!.insert(toBob.id)
        expected["carol"]!.insert(try bob.store.enqueueText("bob to carol", to: "carol", expiresAt: expiry).id)
        expected["alice"]!.insert(try carol.store.enqueueText("carol to alice", to: "alice", expiresAt: expiry).id)

        let ssdpPort = String(randomSSDPPort())
        func start(_ index: Int, _ person: TestPeople.Person, label: String) throws -> RunningPeer {
            try hosts.run(index, ["run", "--home", person.home.path, "--interface", "eth0", "--ssdp-port", ssdpPort,
                                  "--json", "--max-age", "5", "--throttle", String(throttle)], label: label)
        }
        var alicePeer = try start(0, alice, label: "alice")
        var bobPeer = try start(1, bob, label: "bob")
        let carolPeer = try start(2, carol, label: "carol")
        let started = try await alicePeer.waitFor("started") { $0.isStarted }
        #expect(started.startedLocation?.description.hasPrefix("http://10.217.9.1:") == true)

        // Both files move at once. SIGKILL the receiver Bob partway through the report, then the sender
        // Alice partway through Carol's photo; restart both.
        func partway(_ id: UUID) -> (NodeEvent) -> Bool {
            { event in
                guard let progress = event.progress, progress.id == id else { return false }
                return progress.bytes > 0 && progress.bytes < UInt64(fileSize / 2)
            }
        }
        try await bobPeer.waitFor("report progress", partway(toBob.id))
        try await carolPeer.waitFor("photo progress", partway(toCarol.id))
        bobPeer.kill(signal: SIGKILL)
        alicePeer.kill(signal: SIGKILL)
        #expect(try !bob.store.inbox().contains { $0.itemID == toBob.id })
        #expect(try !carol.store.inbox().contains { $0.itemID == toCarol.id })
        bobPeer = try start(1, bob, label: "bob (restarted)")
        alicePeer = try start(0, alice, label: "alice (restarted)")
        do {
            try await carolPeer.waitFor("the photo", timeout: .seconds(30)) { $0.receivedItem?.id == toCarol.id }
            try await bobPeer.waitFor("the report", timeout: .seconds(30)) { $0.receivedItem?.id == toBob.id }
        } catch {
            let outputs = [alicePeer, bobPeer, carolPeer].map { "--- \($0.label)\n" + String($0.output.suffix(8000)) }
            Issue.record("the peers' events:\n\(outputs.joined(separator: "\n"))")
            throw error
        }
        // Both transfers resumed where the receiver's durable bytes ended, not from zero.
        for (peer, id) in [(carolPeer, toCarol.id), (bobPeer, toBob.id)] {
            #expect(peer.events.contains {
                if case .delivery(_, .transferStarted(id, let offset, _)) = $0 { offset > 0 } else { false }
            }, "\(peer.label)")
        }

        // Everything else arrives too; then a clean stop.
        let settled = try await waitUntil(timeout: .seconds(20), every: .milliseconds(100)) {
            let done = try ["alice", "bob", "carol"].allSatisfy { Set(try people.inbox(of: $0).map(\.id)) == expected[$0] }
            let empty = try people.people.allSatisfy { try $0.store.outbox().isEmpty }
            return done && empty
        }
        if !settled {
            let logs = [alicePeer, bobPeer, carolPeer].map { "--- \($0.label)\n\($0.output.suffix(6000))" }
            Issue.record("deliveries did not finish in 20 s; the peers' events:\n\(logs.joined(separator: "\n"))")
        }
        for peer in [alicePeer, bobPeer, carolPeer] { #expect(peer.kill(signal: SIGTERM) == 0, "\(peer.label): \(peer.output)") }

        for name in ["alice", "bob", "carol"] {
            let inbox = try people.inbox(of: name)
            #expect(Set(inbox.map(\.id)) == expected[name], "\(name): \(inbox)")
            #expect(inbox.count == expected[name]!.count, "\(name) holds a duplicate: \(inbox)")
        }
        #expect(try people.inbox(of: "carol").allSatisfy { $0.from == "alice" || $0.from == "bob" })
        #expect(try people.people.allSatisfy { try $0.store.outbox().isEmpty })
        for (id, content, person) in [(toCarol.id, photo, carol), (toBob.id, report, bob)] {
            let item = try #require(try person.store.inbox().first { $0.itemID == id })
            #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(item.filePath))) == content)
        }
    }
}

/// `ip` exited non-zero while building or tearing down the test network.
struct IPCommandFailure: Error, CustomStringConvertible {
    let description: String
}
