import Foundation
import Testing
import ThaliTestSupport

/// `thali-node bench relay --json` as scripts read it (issue 25): a tiny run through two real relaying
/// nodes; the figures are printed, never asserted, but every byte is checked against the pattern.
@Suite("thali-node bench relay", .serialized)
struct BenchRelayTests {
    @Test("--json prints the relay and direct figures, and every byte of both paths was checked")
    func jsonFigures() async throws {
        let object = try await thaliNodeJSONObject(["bench", "relay", "--json", "--mib", "1", "--parallel", "2",
                                                    "--parallel-mib", "1", "--requests", "5"])
        #expect(Set(object.keys) == ["relay_mb_s", "direct_mb_s", "parallel_ratio", "added_latency_ms", "relay_parallel_mb_s",
                                     "direct_parallel_mb_s", "relay_latency_ms", "direct_latency_ms", "verified_bytes",
                                     "mib", "parallel", "parallel_mib", "requests"])
        for key in ["relay_mb_s", "direct_mb_s", "relay_parallel_mb_s", "direct_parallel_mb_s", "relay_latency_ms", "direct_latency_ms"] {
            #expect((object[key] as? Double ?? 0) > 0, "\(key): \(object[key] ?? "absent")")
        }
        // Per path: one 1 MiB stream, two of 1 MiB, and 5 + 1 (warm-up) responses of 64 bytes.
        let perPath = (1 << 20) + 2 * (1 << 20) + 64 * 6
        #expect(object["verified_bytes"] as? Int == 2 * perPath)
    }

    /// The files and processes `--peers` makes: its private directories are named after these.
    static let peerScratchPrefixes = ["thali-bench-stunnel-", "thali-bench-ssh-"]

    @Test("--peers --json measures direct, stunnel, ssh -L and the relay alike: every byte checked, figures consistent, nothing left behind")
    func peersFigures() async throws {
        let temporary = FileManager.default.temporaryDirectory.path
        func leftovers() -> Set<String> {
            let files = (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []
            let processes = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid -> String? in
                guard Int(pid) != nil, let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return nil }
                return "process \(pid): " + String(decoding: data.map { $0 == 0 ? 32 : $0 }, as: UTF8.self)
            }
            return Set((files + processes).filter { entry in Self.peerScratchPrefixes.contains { entry.contains($0) } })
        }
        let before = leftovers()
        let gets = 20
        let object = try await thaliNodeJSONObject(["bench", "relay", "--peers", "--json", "--mib", "1", "--parallel", "2",
                                                    "--parallel-mib", "1", "--requests", "20", "--gets", String(gets)])
        #expect(leftovers().subtracting(before).isEmpty, "\(leftovers().subtracting(before))")
        #expect(object["gets"] as? Int == gets)
        let paths = try #require(object["paths"] as? [String: [String: Any]])
        #expect(Set(paths.keys) == ["direct", "stunnel", "ssh", "relay"])
        let direct = try #require(paths["direct"])
        let ratios = try #require(object["ratios"] as? [String: Any])
        #expect(Set(ratios.keys) == ["relay_vs_stunnel", "relay_vs_ssh"])
        // Per path: one 1 MiB stream, two of 1 MiB, 20 + 2 (warm-up) responses of 64 bytes, and the documents.
        let patternBytes = 3 * (1 << 20) + 64 * 22
        for (name, path) in paths {
            guard path["present"] as? Bool == true else {
                #expect(["stunnel", "ssh"].contains(name) && !TestEnvironment.peersRequired,
                        "\(name) is absent: \(path["absent_reason"] ?? "no reason")")
                #expect(path["absent_reason"] is String)
                #expect(ratios["relay_vs_\(name)"] is NSNull)
                continue
            }
            for key in ["single_mb_s", "parallel_mb_s", "round_trip_median_ms", "round_trip_p99_ms", "gets_s"] {
                #expect((path[key] as? Double ?? 0) > 0, "\(name) \(key): \(path[key] ?? "absent")")
            }
            let median = try #require(path["round_trip_median_ms"] as? Double)
            let p99 = try #require(path["round_trip_p99_ms"] as? Double)
            #expect(p99 >= median, "\(name)")
            for (key, figure) in [("added_round_trip_median_ms", median), ("added_round_trip_p99_ms", p99)] {
                let base = direct[key == "added_round_trip_median_ms" ? "round_trip_median_ms" : "round_trip_p99_ms"] as? Double ?? .nan
                let added = path[key] as? Double ?? .nan
                #expect(abs(added - (figure - base)) <= 0.00021, "\(name) \(key): \(added) against \(figure) - \(base)")
            }
            let verified = path["verified_bytes"] as? Int ?? 0
            #expect(verified > patternBytes + gets * 60, "\(name): \(verified)")
            #expect(verified == direct["verified_bytes"] as? Int, "\(name): every path carries the same bytes")
            let cpuKeys = ["cpu_s_per_gb", "cpu_ms_per_1000_round_trips", "cpu_ms_per_1000_gets"]
            if name == "direct" {
                #expect(path["processes"] as? Int == 0)
                for key in cpuKeys { #expect(path[key] is NSNull, "direct \(key)") }
            } else {
                #expect(path["processes"] as? Int == 2, "\(name): two forwarding processes")
                for key in cpuKeys { #expect((path[key] as? Double ?? -1) >= 0, "\(name) \(key): \(path[key] ?? "absent")") }
            }
        }
        let relay = try #require(paths["relay"])
        #expect(relay["present"] as? Bool == true)
        for peer in ["stunnel", "ssh"] {
            guard let other = paths[peer], other["present"] as? Bool == true else { continue }
            let ratio = try #require(ratios["relay_vs_\(peer)"] as? [String: Any])
            #expect(ratio.count == 10)
            for (key, value) in ratio {
                let mine = try #require(relay[key] as? Double, "\(key)")
                let theirs = try #require(other[key] as? Double, "\(key)")
                if theirs > 0 {
                    let reported = try #require(value as? Double, "relay_vs_\(peer) \(key)")
                    #expect(abs(reported - mine / theirs) <= 0.00051, "relay_vs_\(peer) \(key): \(reported) against \(mine) / \(theirs)")
                } else {
                    #expect(value is NSNull, "relay_vs_\(peer) \(key)")
                }
            }
        }
    }
}
