import Foundation
import Testing
import ThaliTestSupport

@testable import ThaliConformance

/// `thali-node conformance target` against our own `thali-node run`, against nothing, and against a
/// naive fetcher (an independent, deliberately lenient SSDP listener in Python): the cases pass for a
/// conforming peer, cannot pass vacuously, and fail for one that fetches whatever it hears.
@Suite("Conformance target mode", .serialized, .enabled(if: TestEnvironment.available(PackagePaths.thaliNode() != nil)))
struct TargetModeTests {
    /// Joins the SSDP group on loopback and fetches `/NotificationBeacons` from every LOCATION it reads,
    /// on every datagram: what a receiver without the strict grammar does. Every half second it also
    /// announces a USN of its own and searches without `S` (a searcher that ignores SSDP-2.6), from one
    /// socket, as a Thali peer does; its LOCATION is a closed port, so nobody fetches anything there.
    static let naiveFetcher = #"""
    import re, socket, struct, sys, threading, time, urllib.request, uuid
    port = int(sys.argv[1])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, struct.pack("4s4s", socket.inet_aton("239.255.255.250"), socket.inet_aton("127.0.0.1")))
    def announce():
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        out.bind(("127.0.0.1", 0))
        out.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        host, nt, usn = "239.255.255.250:%d" % port, "http://www.thaliproject.org/ssdp", "uuid:%s" % uuid.uuid4()
        alive = ("NOTIFY * HTTP/1.1\r\nHOST: %s\r\nNT: %s\r\nNTS: ssdp:alive\r\nUSN: %s\r\n"
                 "LOCATION: http://127.0.0.1:9/NotificationBeacons\r\nCACHE-CONTROL: max-age=5\r\n\r\n") % (host, nt, usn)
        search = "M-SEARCH * HTTP/1.1\r\nHOST: %s\r\nMAN: \"ssdp:discover\"\r\nMX: 3\r\nST: %s\r\n\r\n" % (host, nt)
        while True:
            out.sendto(alive.encode(), ("239.255.255.250", port))
            out.sendto(search.encode(), ("239.255.255.250", port))
            time.sleep(0.5)  # kept: paces the announcements; nothing waits for a result
    threading.Thread(target=announce, daemon=True).start()
    print("listening", flush=True)
    def fetch(location):
        try:
            urllib.request.urlopen(re.sub(r"^(http://[^/]+).*$", r"\1", location) + "/NotificationBeacons", timeout=2).read()
        except Exception:
            pass
    while True:
        data, _ = s.recvfrom(2048)
        match = re.search(rb"(?im)^location:\s*(\S+)", data)
        if match:
            threading.Thread(target=fetch, args=(match.group(1).decode(),)).start()
    """#

    /// Runs target mode; with `keys` (the implementation's public key, the suite's identity file) the
    /// beacon cases too.
    static func runTarget(ssdpPort: Int, directory: String, keys: (peer: String, identity: String)? = nil)
        async throws -> (status: Int32, verdicts: [String: String], output: String) {
        try await finish(try startTarget(ssdpPort: ssdpPort, directory: directory, keys: keys), directory: directory)
    }

    /// Starts target mode (`--search-wait-s` when `searchWait` is given).
    static func startTarget(ssdpPort: Int, directory: String, keys: (peer: String, identity: String)? = nil,
                            searchWait: Int? = nil) throws -> ChildProcess {
        try ChildProcess(try #require(PackagePaths.thaliNode()),
                         ["conformance", "target", "--address", "127.0.0.1", "--ssdp-port", String(ssdpPort),
                          "--observe-s", "2", "--json-out", directory + "/target.json"]
                             + (keys.map { ["--peer-key", $0.peer, "--identity", $0.identity] } ?? [])
                             + (searchWait.map { ["--search-wait-s", String($0)] } ?? []))
    }

    /// Waits for target mode to end; its exit status, the verdicts by case and its output.
    static func finish(_ run: ChildProcess, directory: String) async throws -> (status: Int32, verdicts: [String: String], output: String) {
        let jsonPath = directory + "/target.json"
        let status = try await run.waitForExit(timeout: .seconds(60))
        let object = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: jsonPath))) as? [String: Any]
        let results = try #require(object?["results"] as? [[String: Any]])
        var verdicts: [String: String] = [:]
        for result in results { if let id = result["id"] as? String { verdicts[id] = result["verdict"] as? String } }
        return (status, verdicts, run.output)
    }

    static func scratch() throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("thali-target-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    @Test("against thali-node run, a contact of the suite, started once the suite listens: every case passes, its search and the beacon cases too, each printed as it ends")
    func againstOurNode() async throws {
        let prepared = try PeerModeTests.prepareImplementation()
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let target = try Self.startTarget(ssdpPort: prepared.ssdpPort, directory: directory,
                                          keys: (prepared.iutKey, prepared.suite + "/identity.key"), searchWait: 20)
        try await target.waitForOutput(containing: "start it now", timeout: .seconds(20))
        let implementation = try await prepared.start()
        defer { implementation.remove() }
        let (status, verdicts, output) = try await Self.finish(target, directory: directory)
        #expect(status == 0, "\(output)\n--- node:\n\(implementation.peer.output)")
        #expect(Set(verdicts.keys) == Set(TargetConformance.Cases.all.map(\.id)))
        for (id, verdict) in verdicts { #expect(verdict == "PASS", "\(id)\n\(output)") }
        // Ours searches as it joins, before it advertises anything: no S, and the form graded.
        #expect(output.contains("none with S while it advertised nothing"), "\(output)")
        #expect(output.split(separator: "\n").filter { $0.hasPrefix("PASS ") }.count == TargetConformance.Cases.all.count)
    }

    @Test("against nothing: the control case fails and the rest cannot pass, so silence is not conformance")
    func againstNothing() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (status, verdicts, output) = try await Self.runTarget(ssdpPort: Int.random(in: 40_001...50_000), directory: directory)
        #expect(status == 1)
        #expect(verdicts[TargetConformance.Cases.validFetched.id] == "FAIL", "\(output)")
        #expect(verdicts[TargetConformance.Cases.searchForm.id] == "N/A", "nothing searched: \(output)")
        for testCase in TargetConformance.Cases.scripted.dropFirst() { #expect(verdicts[testCase.id] == "INCONCLUSIVE", "\(testCase.id)") }
    }

    @Test("against a naive fetcher: every case that needs the strict grammar, the USN rules or a busy server's Retry-After fails, and its searches without S")
    func againstNaiveFetcher() async throws {
        let python = ChildProcess.testVenvPython(packageRoot: PackagePaths.root()) ?? "/usr/bin/python3"
        let ssdpPort = Int.random(in: 50_001...60_000)
        let fetcher = try ChildProcess(python, ["-c", Self.naiveFetcher, String(ssdpPort)])
        defer { fetcher.terminate(grace: .milliseconds(200)) }
        try await fetcher.waitForOutput(containing: "listening", timeout: .seconds(10))
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (status, verdicts, output) = try await Self.runTarget(ssdpPort: ssdpPort, directory: directory)
        #expect(status == 1)
        let cases = TargetConformance.Cases.self
        #expect(verdicts[cases.validFetched.id] == "PASS", "\(output)")
        #expect(verdicts[cases.noMatchNoConnect.id] == "PASS", "\(output)")
        // It fetches on every alive: the second alive, half a period after the busy answer, fetches again too soon.
        for testCase in [cases.fetchOnce, cases.malformed, cases.foreignNT, cases.badUSN, cases.spoofedLocation, cases.forgedByebye,
                         cases.busyWaited, cases.searchForm] {
            #expect(verdicts[testCase.id] == "FAIL", "\(testCase.id)\n\(output)")
        }
    }
}
