import ArgumentParser
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `bench relay --peers`: the same workloads through direct loopback, stunnel, `ssh -L` and the relay, one
/// path after the other in one run (each forwarder started before its path is measured and stopped after).
extension BenchRelay {
    /// The paths measured, in order: direct loopback, then each forwarder.
    static let peerPathNames = ["direct", "stunnel", "ssh", "relay"]
    /// The paths the relay is compared with in `ratios` (`relay_vs_<name>`).
    static let comparedPeers = ["stunnel", "ssh"]
    /// The figures a ratio is given for: the relay's figure over the peer's.
    static let ratioKeys = ["single_mb_s", "parallel_mb_s", "round_trip_median_ms", "round_trip_p99_ms",
                            "added_round_trip_median_ms", "added_round_trip_p99_ms", "gets_s",
                            "cpu_s_per_gb", "cpu_ms_per_1000_round_trips", "cpu_ms_per_1000_gets"]

    /// What one path measured.
    struct PeerPathFigures {
        var singleMBs: Double
        var parallelMBs: Double
        var roundTripMedianMs: Double
        var roundTripP99Ms: Double
        var getsSeconds: Double
        /// CPU seconds of the forwarding processes during the two bulk transfers, the round trips and the
        /// GETs; nil for direct loopback, which has none.
        var bulkCPU: Double?
        var roundTripCPU: Double?
        var getsCPU: Double?
        var bulkBytes: Int
        var roundTrips: Int
        var verifiedBytes: Int
        var processes: Int
    }

    func runPeers() async throws {
        let app = try RelayBenchApp()
        defer { app.stop() }
        var paths: [String: Result<PeerPathFigures, RelayBenchPeerAbsent>] = [:]
        paths["direct"] = .success(try measurePeerPath(port: app.port, pids: nil))
        for name in Self.peerPathNames.dropFirst() {
            let forwarder: RelayBenchForwarder
            do {
                switch name {
                case "stunnel": forwarder = try StunnelForwarder(appPort: app.port, timeout: timeout)
                case "ssh": forwarder = try SSHForwarder(appPort: app.port, timeout: timeout)
                default: forwarder = try await RelayBenchNodeForwarder(appPort: app.port, timeout: timeout)
                }
            } catch let absent as RelayBenchPeerAbsent {
                // The test environment's promise that every peer is installed (`scripts/test.sh`).
                if ProcessInfo.processInfo.environment["THALI_REQUIRE_PEERS"] == "1" {
                    throw ValidationError("\(absent.description), and THALI_REQUIRE_PEERS=1 requires it")
                }
                paths[name] = .failure(absent)
                continue
            }
            defer { forwarder.stop() }
            paths[name] = .success(try measurePeerPath(port: forwarder.port, pids: forwarder.pids))
        }
        report(paths)
    }

    private func measurePeerPath(port: Int, pids: [pid_t]?) throws -> PeerPathFigures {
        func cpu() -> Double? { pids.map { ProcessCPU.seconds(of: $0) } }
        func spent(_ from: Double?, _ to: Double?) -> Double? { from.flatMap { from in to.map { $0 - from } } }
        let beforeBulk = cpu()
        let single = try RelayBenchApp.transfer(port: port, bytes: mib << 20, streams: 1)
        let parallelRun = try RelayBenchApp.transfer(port: port, bytes: parallelMib << 20, streams: parallel)
        let beforeRoundTrips = cpu()
        let warmUp = max(1, requests / 10)
        let latency = try RelayBenchApp.roundTrips(port: port, responseBytes: responseBytes, requests: requests, warmUp: warmUp)
        let beforeGets = cpu()
        let getsRun = try RelayBenchApp.keepAliveGets(port: port, gets: gets)
        let end = cpu()
        let times = latency.sortedMs
        let p99 = times[min(times.count - 1, Int((Double(times.count) * 0.99).rounded(.up)) - 1)]
        return PeerPathFigures(
            singleMBs: single.megabytesPerSecond, parallelMBs: parallelRun.megabytesPerSecond,
            roundTripMedianMs: times[times.count / 2], roundTripP99Ms: p99, getsSeconds: getsRun.seconds,
            bulkCPU: spent(beforeBulk, beforeRoundTrips), roundTripCPU: spent(beforeRoundTrips, beforeGets),
            getsCPU: spent(beforeGets, end), bulkBytes: single.bytes + parallelRun.bytes, roundTrips: warmUp + requests,
            verifiedBytes: single.bytes + parallelRun.bytes + latency.bytes + getsRun.bytes, processes: pids.map { $0.count } ?? 0)
    }

    private func report(_ paths: [String: Result<PeerPathFigures, RelayBenchPeerAbsent>]) {
        func rounded(_ value: Double, _ places: Double) -> Double { (value * places).rounded() / places }
        guard case .success(let direct) = paths["direct"] else { return }
        var objects: [String: [String: Any]] = [:]
        for name in Self.peerPathNames {
            switch paths[name] {
            case .success(let path):
                var object: [String: Any] = [
                    "present": true,
                    "single_mb_s": rounded(path.singleMBs, 10), "parallel_mb_s": rounded(path.parallelMBs, 10),
                    "round_trip_median_ms": rounded(path.roundTripMedianMs, 10_000),
                    "round_trip_p99_ms": rounded(path.roundTripP99Ms, 10_000),
                    "added_round_trip_median_ms": rounded(path.roundTripMedianMs - direct.roundTripMedianMs, 10_000),
                    "added_round_trip_p99_ms": rounded(path.roundTripP99Ms - direct.roundTripP99Ms, 10_000),
                    "gets_s": rounded(path.getsSeconds, 10_000),
                    "verified_bytes": path.verifiedBytes, "processes": path.processes,
                ]
                let cpu: [(String, Double?)] = [
                    ("cpu_s_per_gb", path.bulkCPU.map { $0 / (Double(path.bulkBytes) / 1e9) }),
                    ("cpu_ms_per_1000_round_trips", path.roundTripCPU.map { $0 * 1000 / (Double(path.roundTrips) / 1000) }),
                    ("cpu_ms_per_1000_gets", path.getsCPU.map { $0 * 1000 / (Double(gets + 1) / 1000) }),
                ]
                for (key, value) in cpu { object[key] = value.map { rounded($0, 10_000) } ?? NSNull() }
                objects[name] = object
            case .failure(let absent):
                objects[name] = ["present": false, "absent_reason": absent.description]
            case nil:
                break
            }
        }
        var ratios: [String: Any] = [:]
        for peer in Self.comparedPeers {
            guard let relay = objects["relay"], relay["present"] as? Bool == true,
                  let other = objects[peer], other["present"] as? Bool == true else {
                ratios["relay_vs_\(peer)"] = NSNull()
                continue
            }
            var ratio: [String: Any] = [:]
            for key in Self.ratioKeys {
                if let mine = relay[key] as? Double, let theirs = other[key] as? Double, theirs > 0 {
                    ratio[key] = rounded(mine / theirs, 1000)
                } else {
                    ratio[key] = NSNull()
                }
            }
            ratios["relay_vs_\(peer)"] = ratio
        }
        if json {
            let object: [String: Any] = [
                "paths": objects, "ratios": ratios, "mib": mib, "parallel": parallel, "parallel_mib": parallelMib,
                "requests": requests, "response_bytes": responseBytes, "gets": gets,
            ]
            if let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) {
                Swift.print(String(decoding: data, as: UTF8.self))
            }
            return
        }
        printTable(objects, ratios)
    }

    private func printTable(_ objects: [String: [String: Any]], _ ratios: [String: Any]) {
        let rows: [(String, String)] = [
            ("one stream of \(mib) MiB, MB/s", "single_mb_s"),
            ("\(parallel) streams of \(parallelMib) MiB, MB/s", "parallel_mb_s"),
            ("\(responseBytes)-byte round trip, median ms", "round_trip_median_ms"),
            ("\(responseBytes)-byte round trip, p99 ms", "round_trip_p99_ms"),
            ("added to direct, median ms", "added_round_trip_median_ms"),
            ("added to direct, p99 ms", "added_round_trip_p99_ms"),
            ("\(gets) keep-alive GETs, s", "gets_s"),
            ("CPU s per relayed GB", "cpu_s_per_gb"),
            ("CPU ms per 1,000 round trips", "cpu_ms_per_1000_round_trips"),
            ("CPU ms per 1,000 GETs", "cpu_ms_per_1000_gets"),
        ]
        func cell(_ value: Any?) -> String {
            switch value {
            case let number as Double: return String(format: "%.4g", number)
            case is NSNull: return "-"
            default: return "absent"
            }
        }
        let header = ["figure".padding(toLength: 36, withPad: " ", startingAt: 0)]
            + Self.peerPathNames.map { $0.padding(toLength: 10, withPad: " ", startingAt: 0) }
            + Self.comparedPeers.map { "relay/\($0)".padding(toLength: 14, withPad: " ", startingAt: 0) }
        Swift.print("relay --peers: " + header.joined(separator: " "))
        for (label, key) in rows {
            let cells = [label.padding(toLength: 36, withPad: " ", startingAt: 0)]
                + Self.peerPathNames.map { cell(objects[$0]?["present"] as? Bool == false ? nil : objects[$0]?[key] ?? NSNull())
                    .padding(toLength: 10, withPad: " ", startingAt: 0) }
                + Self.comparedPeers.map { cell((ratios["relay_vs_\($0)"] as? [String: Any])?[key] ?? NSNull())
                    .padding(toLength: 14, withPad: " ", startingAt: 0) }
            Swift.print("relay --peers: " + cells.joined(separator: " "))
        }
        for name in Self.peerPathNames {
            if let reason = objects[name]?["absent_reason"] as? String { Swift.print("relay --peers: \(name) absent: \(reason)") }
        }
        let verified = Self.peerPathNames.compactMap { objects[$0]?["verified_bytes"] as? Int }.reduce(0, +)
        Swift.print("relay --peers: \(verified) bytes checked against the pattern and the documents")
    }
}

/// The relay as a forwarder of ``BenchRelay/runPeers()``: ``RelayBenchNodes``, both nodes' CPU counted.
final class RelayBenchNodeForwarder: RelayBenchForwarder {
    let name = "relay"
    let port: Int
    let pids: [pid_t]
    private let nodes: RelayBenchNodes

    init(appPort: Int, timeout: Double) async throws {
        let nodes = try await RelayBenchNodes(appPort: appPort, timeout: timeout)
        (self.nodes, port, pids) = (nodes, nodes.relayPort, nodes.pids)
    }

    func stop() { nodes.stop() }
}
