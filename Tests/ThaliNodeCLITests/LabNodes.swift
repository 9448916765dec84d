import Foundation
import Testing
import ThaliNetLab
import ThaliTestSupport
@testable import ThaliNodeCore

#if canImport(Glibc)
import Glibc
#endif

/// People's `thali-node run --interface eth0 --json` processes in the hosts of a lab (`NetLab`, issue 38):
/// person `i` runs in host `i`. ``close()`` (also on deinit) stops every process it started, then deletes
/// the lab: a process in a deleted namespace would run on without a network.
final class LabNodes: @unchecked Sendable {
    let lab: NetLab
    let people: TestPeople
    let ssdpPort = randomSSDPPort()
    private let lock = NSLock()
    private var running: [RunningPeer] = []

    /// Whether this machine can build a lab (root, `ip`, `/dev/net/tun`).
    static let available = TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces
                                                     && FileManager.default.fileExists(atPath: "/dev/net/tun"))

    /// A lab of `hostCount` hosts (default: one per name), shaped by `profile` with its random draws from
    /// `seed`, and the people, each the others' contact.
    init(profile: LinkProfile, seed: UInt64, names: [String], hostCount: Int? = nil, label: String) throws {
        people = try TestPeople(names, label: label)
        lab = try NetLab(hostCount: hostCount ?? names.count, profile: profile, seed: seed)
    }

    deinit { close() }

    /// Starts `run` for the person in host `index`, with `arguments` added.
    func start(_ index: Int, _ arguments: [String] = []) throws -> RunningPeer {
        let person = people.people[index]
        let ip = ChildProcess.which("ip") ?? "/usr/sbin/ip"
        let command = lab.command(inHost: index, [thaliNodeExecutable, "run", "--home", person.home.path, "--interface",
                                                  NetLab.interfaceName, "--ssdp-port", String(ssdpPort), "--json"] + arguments)
        let peer = try RunningPeer(person.name, ip, Array(command.dropFirst()))
        lock.withLock { running.append(peer) }
        return peer
    }

    /// Writes `object` as the `config.json` of every person (read by `run` at start).
    func configure(_ object: [String: Any]) throws {
        let data = try JSONSerialization.data(withJSONObject: object)
        for person in people.people { try data.write(to: URL(fileURLWithPath: person.home.configurationPath)) }
    }

    /// Each process's last output, for a failure's report.
    func report() -> String {
        lock.withLock { running }.map { "--- \($0.label)\n" + String($0.output.suffix(6000)) }.joined(separator: "\n")
    }

    /// With `THALI_LAB_TRACE=FILE` in the environment, writes every process's whole output there (for
    /// reading a run's timeline).
    func writeTrace() {
        guard let path = ProcessInfo.processInfo.environment["THALI_LAB_TRACE"] else { return }
        let text = lock.withLock { running }.map { "===== \($0.label)\n" + $0.output }.joined(separator: "\n")
        try? text.write(toFile: path, atomically: false, encoding: .utf8)
    }

    /// Stops every process (SIGTERM, then SIGKILL after 5 s) and deletes the lab. Idempotent.
    func close() {
        let peers = lock.withLock { () -> [RunningPeer] in
            defer { running = [] }
            return running
        }
        for peer in peers { peer.kill(signal: SIGTERM, grace: .seconds(5)) }
        lab.close()
    }
}

/// The harness itself: what the lab tests rely on when they end, however they end.
@Suite("The lab tests' harness", .serialized)
struct LabNodesTests {
    @Test("close stops every run it started and deletes the lab's namespaces; a second close does nothing",
          .enabled(if: LabNodes.available), .timeLimit(.minutes(1)))
    func closeLeavesNothingBehind() async throws {
        let nodes = try LabNodes(profile: .unshaped, seed: 1, names: ["alice", "bob"], label: "labclose")
        let namespaces = nodes.lab.hosts.map(\.namespace)
        let alice = try nodes.start(0)
        _ = try await alice.waitFor("alice started in the lab") { $0.isStarted }
        #expect(!alice.hasExited)
        #expect(namespaces.allSatisfy { (try? runCommand("ip", ["netns", "list"]))?.contains($0) == true })
        nodes.close()
        #expect(alice.hasExited, "the run in the lab outlived close")
        let listing = try runCommand("ip", ["netns", "list"])
        for name in namespaces { #expect(!listing.contains(name), "\(name) left behind") }
        nodes.close()
    }
}
