import Foundation
import NIOConcurrencyHelpers
import ThaliBeacons
import ThaliNodeCore
import ThaliProcess

#if canImport(Glibc)
import Glibc
#endif

/// Two real `thali-node run --json` child processes on 127.0.0.1 that know each other as contacts `a`
/// and `b`, in data directories of their own under the temporary directory: the path users run, for the
/// benchmarks that measure it (`bench relay`, `bench delivery`'s node figures). Made in two steps so a
/// benchmark can put something in a node's store (a queued file) before the nodes run.
final class BenchNodePair: Sendable {
    /// The contacts' names, which are also the nodes' names: `homes[0]` is a's, `homes[1]` b's.
    static let names = ["a", "b"]
    let root: String
    let homes: [NodeHome]
    private let peers = NIOLockedValueBox<[SpawnedPeer]>([])

    /// Creates both data directories, identities and contact entries; starts nothing.
    init(label: String) throws {
        let root = FileManager.default.temporaryDirectory
            .appendingPathComponent("thali-bench-\(label)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        let homes = Self.names.map { NodeHome(path: "\(root)/\($0)") }
        (self.root, self.homes) = (root, homes)
        do {
            try BenchInterruption.starting {
                try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
                BenchInterruption.keep(directory: root)
            }
            var keys: [PrivateKey] = []
            for home in homes {
                try home.create()
                keys.append(try NodeIdentity.create(in: home))
            }
            for (index, home) in homes.enumerated() {
                let other = 1 - index
                try NodeStore(home: home).addContact(name: Self.names[other],
                                                     publicKey: keys[other].publicKey.hexString(compressed: true))
            }
        } catch {
            try? FileManager.default.removeItem(atPath: root)
            BenchInterruption.forget(directory: root)
            throw error
        }
    }

    /// Starts both nodes with `arguments` added to their `run` command; `onRecord` gets every JSON
    /// record either prints, with the node's name, on the thread reading that node's output. With
    /// `hosts`, node `i` runs inside network namespace `hosts[i].namespace` (`ip netns exec`) on its
    /// interface there, instead of on 127.0.0.1.
    func start(arguments: [String], hosts: [(namespace: String, interface: String)]? = nil,
               onRecord: @escaping @Sendable (String, [String: Any]) -> Void) throws {
        let ssdpPort = Int.random(in: 20000...60000)
        do {
            let executable = try SpawnedPeer.ownExecutable()
            for (index, (name, home)) in zip(Self.names, homes).enumerated() {
                let place = hosts.map { ["--interface", $0[index].interface] } ?? ["--address", "127.0.0.1"]
                var run = ["run", "--home", home.path, "--json"] + place + ["--ssdp-port", String(ssdpPort),
                           "--per-source-limit", "1000"] + arguments
                var launcher = executable
                if let hosts {
                    launcher = "ip"
                    run = ["netns", "exec", hosts[index].namespace, executable] + run
                }
                let peer = try BenchInterruption.starting {
                    try SpawnedPeer(name: name, executable: launcher, arguments: run, stderrPath: home.path + "/run.log") { line in
                        guard let record = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return }
                        onRecord(name, record)
                    }
                }
                peers.withLockedValue { $0.append(peer) }
            }
        } catch {
            stop()
            throw error
        }
    }

    /// The nodes' process ids (a's first), once started.
    var pids: [pid_t] { peers.withLockedValue { $0.map(\.pid) } }

    /// The names of the nodes that exited.
    var exited: [String] { peers.withLockedValue { $0.filter(\.hasExited).map(\.name) } }

    /// Polls `found` every 10 ms until it gives a value, `seconds` pass or a node exits; nil unless it gave one.
    func wait<Value>(seconds: Double, for found: () -> Value?) async -> Value? {
        let clock = ContinuousClock()
        let deadline = clock.now + .milliseconds(Int64(seconds * 1000))
        while clock.now < deadline {
            if let value = found() { return value }
            if !exited.isEmpty { return found() }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return found()
    }

    /// Stops both nodes (their data directories stay until ``stop()``).
    func stopNodes() {
        for peer in peers.withLockedValue({ $0 }) { peer.terminate(grace: 2) }
    }

    /// Stops both nodes and removes their data directories.
    func stop() {
        stopNodes()
        try? FileManager.default.removeItem(atPath: root)
        BenchInterruption.forget(directory: root)
    }
}
