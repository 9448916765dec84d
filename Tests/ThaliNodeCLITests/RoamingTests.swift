import Foundation
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// `ip` for the namespace tests, if present.
private let ipTool = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first { FileManager.default.isExecutableFile(atPath: $0) } ?? "ip"

/// Two hosts: network namespaces joined by one veth pair, each end `eth0` in its namespace with an
/// address that exists only there; deinit deletes both namespaces (and with them the pair).
private final class TwoHosts: @unchecked Sendable {
    let names: [String]
    let addresses: [String]

    init(prefix: String, subnet: String) throws {
        names = [prefix + "a", prefix + "b"]
        addresses = [subnet + ".1", subnet + ".2"]
        for name in names { _ = try? Self.ip(["netns", "del", name]) }  // a leftover of a crashed run with the same pid
        do {
            for name in names {
                try Self.ip(["netns", "add", name])
                try Self.ip(["-n", name, "link", "set", "lo", "up"])
            }
            try Self.ip(["-n", names[0], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", names[1]])
            for (name, address) in zip(names, addresses) {
                try Self.ip(["-n", name, "addr", "add", address + "/24", "dev", "eth0"])
                try Self.ip(["-n", name, "link", "set", "eth0", "up"])
            }
        } catch {
            deleteAll()
            throw error
        }
    }

    deinit { deleteAll() }

    private func deleteAll() {
        for name in names { _ = try? Self.ip(["netns", "del", name]) }
    }

    /// Replaces host `index`'s address with `address` (`ip addr del`, then `add`): a phone that joined
    /// another access point.
    func replaceAddress(of index: Int, with address: String) throws {
        try Self.ip(["-n", names[index], "addr", "del", addresses[index] + "/24", "dev", "eth0"])
        try Self.ip(["-n", names[index], "addr", "add", address + "/24", "dev", "eth0"])
    }

    @discardableResult
    static func ip(_ arguments: [String]) throws -> String {
        let result = try ChildProcess.run(ipTool, arguments, timeout: .seconds(10))
        guard result.status == 0 else {
            throw IPCommandFailure(description: "ip \(arguments.joined(separator: " ")): \(result.output)")
        }
        return result.output
    }

    /// `thali-node run` inside host `index`.
    func run(_ index: Int, _ arguments: [String], label: String) throws -> RunningPeer {
        try RunningPeer(label, ipTool, ["netns", "exec", names[index], thaliNodeExecutable] + arguments)
    }
}

/// Roaming (spec/node.md, "Roaming"): a `run --interface` node whose address is replaced moves to the
/// new one, and its contact finds it there.
@Suite("Roaming: an address change", .serialized)
struct RoamingTests {
    /// `relay`: both nodes in relay mode, whose sessions stay open: Bob's session with Alice's old
    /// location must be closed when her beacons come from the new one, not left to the keepalive.
    @Test(.enabled(if: TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces)), .timeLimit(.minutes(2)),
          arguments: [false, true])
    func aContactFindsTheNodeAtItsNewAddress(relay: Bool) async throws {
        let subnet = "10.219.\(getpid() % 200 + 20)"
        let hosts = try TwoHosts(prefix: "troam\(getpid())", subnet: subnet)
        let people = try TestPeople(["alice", "bob", "carol"], label: "roam")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let expiry = Date().addingTimeInterval(600)
        let first = try alice.store.enqueueText("before the move", to: "bob", expiresAt: expiry)
        // Carol never runs: Alice keeps announcing throughout, so the move has an announcement to move.
        _ = try alice.store.enqueueText("for carol, who is away", to: "carol", expiresAt: expiry)
        let ssdpPort = String(randomSSDPPort())
        // The default max-age (60 s): the old location must go by its byebye or the USN's move, not by expiry.
        func start(_ index: Int, _ person: TestPeople.Person) throws -> RunningPeer {
            // Nothing listens on the app port inside the namespaces: texts need no app.
            try hosts.run(index, ["run", "--home", person.home.path, "--interface", "eth0", "--ssdp-port", ssdpPort, "--json"]
                            + (relay ? ["--app-port", "5999"] : []), label: person.name)
        }
        let alicePeer = try start(0, alice)
        let bobPeer = try start(1, bob)
        func report() -> String {
            [alicePeer, bobPeer].map { "--- \($0.label)\n" + String($0.output.suffix(8000)) }.joined(separator: "\n")
        }
        do {
            let started = try await alicePeer.waitFor("started") { $0.isStarted }
            let oldLocation = try #require(started.startedLocation)
            #expect(oldLocation.description.hasPrefix("http://\(hosts.addresses[0]):"))
            try await bobPeer.waitFor("the first text") { $0.receivedItem?.id == first.id }

            // Alice's phone joins another access point: another address on the same interface.
            let newAddress = subnet + ".11"
            try hosts.replaceAddress(of: 0, with: newAddress)
            let moved = try await alicePeer.waitFor("alice moves", timeout: .seconds(10)) {
                if case .locationChanged = $0 { true } else { false }
            }
            guard case .locationChanged(let newLocation, let previous) = moved else { return }
            #expect(previous == oldLocation)
            #expect(newLocation.description.hasPrefix("http://\(newAddress):"))
            let second = try alice.store.enqueueText("after the move", to: "bob", expiresAt: expiry)

            // Bob drops the old location at once (the byebye could not leave the removed address; the
            // alive for the same USN at the new LOCATION moved it), not after its max-age of 60 s.
            try await bobPeer.waitFor("the old location leaves", timeout: .seconds(10)) {
                if case .peerLeft(let location, _) = $0 { location == oldLocation } else { false }
            }
            try await bobPeer.waitFor("the new location appears", timeout: .seconds(10)) {
                if case .peerAppeared(let location) = $0 { location == newLocation } else { false }
            }
            try await bobPeer.waitFor("alice matched at the new location", timeout: .seconds(10)) {
                if case .beaconMatched("alice", let location) = $0 { location == newLocation } else { false }
            }
            try await bobPeer.waitFor("the second text", timeout: .seconds(15)) { $0.receivedItem?.id == second.id }
            let settled = try await waitUntil(timeout: .seconds(10), every: .milliseconds(100)) {
                try alice.store.outbox().allSatisfy { $0.id != first.id && $0.id != second.id }
            }
            #expect(settled, "alice still holds items for bob")
        } catch {
            Issue.record("the peers' events:\n\(report())")
            throw error
        }
        for peer in [alicePeer, bobPeer] { #expect(peer.kill(signal: SIGTERM) == 0, "\(peer.label): \(peer.output.suffix(4000))") }
        // Exactly once each.
        let inbox = try people.inbox(of: "bob")
        #expect(inbox.count == 2 && Set(inbox.map(\.id)).count == 2, "\(inbox)")
        #expect(bobPeer.events.filter { $0.receivedItem != nil }.count == 2)
        #expect(!bobPeer.events.contains { if case .delivery(_, .duplicate) = $0 { true } else { false } })
    }
}
