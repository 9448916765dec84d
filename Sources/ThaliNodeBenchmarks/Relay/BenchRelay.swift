import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import ThaliBeacons
import ThaliNodeCore
import ThaliProcess

#if canImport(Glibc)
import Glibc
#endif

/// `thali-node bench relay`: relay mode as an app sees it. A real TCP app (an in-process server on
/// blocking sockets that answers each 8-byte request, a big-endian count, with that many bytes of a
/// known pattern) is reached twice in the same run: directly on loopback, and through two real
/// `thali-node run --app-port` processes (the connecting node's relay port, PSK-TLS and yamux, the
/// accepting node's connection to the app port). Every byte is checked against the pattern.
struct BenchRelay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "relay",
        abstract: "Measure an app's TCP traffic through two relaying nodes against the same traffic on direct loopback.",
        discussion: """
            One stream of --mib MiB, --parallel streams of --parallel-mib MiB each at once, and --requests small \
            request/response round trips (--response-bytes each) on one connection; first direct, then through the \
            relay. Rates in MB/s (10^6 bytes). --json prints one object: relay_mb_s, direct_mb_s, parallel_ratio \
            (relayed parallel throughput over direct), added_latency_ms (median round trip through the relay minus \
            direct), relay_parallel_mb_s, direct_parallel_mb_s, relay_latency_ms, direct_latency_ms, verified_bytes \
            (bytes checked against the pattern, both paths), mib, parallel, parallel_mib, requests. \
            --peers measures the same workloads, one path after the other, through direct loopback, stunnel (Debian's \
            stunnel4: two stunnels, TLS 1.2 with a generated pre-shared key, DHE-PSK-AES256-GCM-SHA384), ssh -L (a \
            private sshd on a loopback port with generated keys, -c aes256-gcm@openssh.com, one connection) and the \
            relay, and adds --gets small HTTP/1.1 keep-alive GETs on one connection (CouchDB replication's shape) and \
            the CPU of each path's forwarding processes (user+sys from /proc/PID/stat: both stunnels; ssh and sshd \
            with its children; both nodes). A path whose program is not installed is reported absent (an error under \
            THALI_REQUIRE_PEERS=1, the test suite's promise that every peer is installed). --json then \
            prints one object: paths (direct, stunnel, ssh, relay), each with present (false with absent_reason when \
            its program is missing), single_mb_s, parallel_mb_s, round_trip_median_ms, round_trip_p99_ms, \
            added_round_trip_median_ms and added_round_trip_p99_ms (minus direct's), gets_s (the GETs' total \
            time), cpu_s_per_gb (CPU seconds per 10^9 bytes of the two bulk transfers), cpu_ms_per_1000_round_trips, \
            cpu_ms_per_1000_gets (null for direct), verified_bytes, processes (forwarding processes counted); ratios: \
            relay_vs_stunnel and relay_vs_ssh (null when either is absent), each the relay's figure over the peer's \
            for every figure above from single_mb_s to cpu_ms_per_1000_gets (null when the peer's is 0); and mib, \
            parallel, parallel_mib, requests, response_bytes, gets. \
            SIGINT, SIGTERM or SIGHUP ends every process the run started (forwarders, nodes, sshd's sessions) and \
            removes its temporary directories; the command then exits with 128 + the signal (130, 143, 129).
            """)

    @Option(help: "MiB of the single-stream transfer.") var mib = 64
    @Option(help: "Streams of the parallel transfer.") var parallel = 20
    @Option(help: "MiB each parallel stream carries.") var parallelMib = 8
    @Option(help: "Small request/response round trips timed (after 10% more as warm-up).") var requests = 500
    @Option(help: "Bytes of each small response.") var responseBytes = 64
    @Option(help: "Keep-alive GETs timed on one connection (after one more), with --peers.") var gets = 2000
    @Flag(help: "Measure stunnel (PSK) and ssh -L beside direct loopback and the relay.") var peers = false
    @Option(help: "Give up when the nodes have not set the relay up within this many seconds.") var timeout = 30.0
    @Flag(help: "Print one JSON object instead of lines.") var json = false

    func validate() throws {
        guard mib >= 1, mib <= 16384 else { throw ValidationError("--mib must be in 1...16384") }
        guard parallel >= 1, parallel <= 256 else { throw ValidationError("--parallel must be in 1...256") }
        guard parallelMib >= 1, parallelMib <= 4096 else { throw ValidationError("--parallel-mib must be in 1...4096") }
        guard requests >= 1, requests <= 1_000_000 else { throw ValidationError("--requests must be in 1...1000000") }
        guard responseBytes >= 1, responseBytes <= 1 << 20 else { throw ValidationError("--response-bytes must be in 1...1048576") }
        guard gets >= 1, gets <= 1_000_000 else { throw ValidationError("--gets must be in 1...1000000") }
        guard timeout > 0 else { throw ValidationError("--timeout must be positive") }
    }

    /// The figures of one path (direct or relayed).
    struct PathFigures {
        var singleMBs: Double
        var parallelMBs: Double
        var latencyMs: Double
        var verifiedBytes: Int
    }

    /// Runs the measurements; a signal (SIGINT, SIGTERM, SIGHUP) ends every process they started and
    /// removes their directories, and the command exits with 128 + the signal (``BenchInterruption``).
    func run() async throws {
        BenchInterruption.install()
        do {
            try await measureAndPrint()
        } catch {
            // An error that a signal caused (its children ended under it) ends as the signal does.
            BenchInterruption.finishIfInterrupted()
            throw error
        }
        BenchInterruption.finishIfInterrupted()
    }

    private func measureAndPrint() async throws {
        if peers { return try await runPeers() }
        let app = try RelayBenchApp()
        defer { app.stop() }
        let direct = try measure(port: app.port)
        let nodes = try await RelayBenchNodes(appPort: app.port, timeout: timeout)
        defer { nodes.stop() }
        let relayed = try measure(port: nodes.relayPort)
        print(figures: direct, relayed)
    }

    private func measure(port: Int) throws -> PathFigures {
        let single = try RelayBenchApp.transfer(port: port, bytes: mib << 20, streams: 1)
        let parallelRun = try RelayBenchApp.transfer(port: port, bytes: parallelMib << 20, streams: parallel)
        let latency = try RelayBenchApp.roundTrips(port: port, responseBytes: responseBytes,
                                                   requests: requests, warmUp: max(1, requests / 10))
        return PathFigures(singleMBs: single.megabytesPerSecond, parallelMBs: parallelRun.megabytesPerSecond,
                           latencyMs: latency.sortedMs[latency.sortedMs.count / 2], verifiedBytes: single.bytes + parallelRun.bytes + latency.bytes)
    }

    private func print(figures direct: PathFigures, _ relayed: PathFigures) {
        func rounded(_ value: Double, _ places: Double = 1000) -> Double { (value * places).rounded() / places }
        let ratio = relayed.parallelMBs / direct.parallelMBs
        let added = relayed.latencyMs - direct.latencyMs
        if json {
            let object: [String: Any] = [
                "relay_mb_s": rounded(relayed.singleMBs, 10), "direct_mb_s": rounded(direct.singleMBs, 10),
                "parallel_ratio": rounded(ratio), "added_latency_ms": rounded(added),
                "relay_parallel_mb_s": rounded(relayed.parallelMBs, 10), "direct_parallel_mb_s": rounded(direct.parallelMBs, 10),
                "relay_latency_ms": rounded(relayed.latencyMs), "direct_latency_ms": rounded(direct.latencyMs),
                "verified_bytes": direct.verifiedBytes + relayed.verifiedBytes,
                "mib": mib, "parallel": parallel, "parallel_mib": parallelMib, "requests": requests,
            ]
            if let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) {
                Swift.print(String(decoding: data, as: UTF8.self))
            }
            return
        }
        Swift.print(String(format: "relay: one stream of %d MiB: relayed %.1f MB/s, direct %.1f MB/s (%.2f)",
                           mib, relayed.singleMBs, direct.singleMBs, relayed.singleMBs / direct.singleMBs))
        Swift.print(String(format: "relay: %d streams of %d MiB: relayed %.1f MB/s, direct %.1f MB/s (parallel ratio %.2f)",
                           parallel, parallelMib, relayed.parallelMBs, direct.parallelMBs, ratio))
        Swift.print(String(format: "relay: %d-byte round trip, median of %d: relayed %.3f ms, direct %.3f ms (added %.3f ms)",
                           responseBytes, requests, relayed.latencyMs, direct.latencyMs, added))
        Swift.print("relay: \(direct.verifiedBytes + relayed.verifiedBytes) bytes checked against the pattern")
    }
}

/// The two relaying nodes of ``BenchRelay``: a ``BenchNodePair`` run with `--app-port`; `relayPort` is
/// node b's relay port to a's app.
final class RelayBenchNodes: Sendable {
    let relayPort: Int
    private let pair: BenchNodePair

    init(appPort: Int, timeout: Double) async throws {
        let pair = try BenchNodePair(label: "relay")
        let found = NIOLockedValueBox<Int?>(nil)
        try pair.start(arguments: ["--app-port", String(appPort)]) { name, record in
            // Node b's relay port to contact a: the path the measurements take.
            guard name == "b", record["event"] as? String == "relay_listening", record["contact"] as? String == "a",
                  let port = record["port"] as? Int else { return }
            found.withLockedValue { $0 = port }
        }
        guard let port = await pair.wait(seconds: timeout, for: { found.withLockedValue { $0 } }) else {
            let exited = pair.exited
            pair.stop()
            throw ValidationError(exited.isEmpty ? "the nodes set no relay up within \(timeout) s"
                                                 : "node \(exited.joined(separator: ", ")) exited before the relay was up")
        }
        self.pair = pair
        relayPort = port
    }

    /// The nodes' process ids (a's first).
    var pids: [pid_t] { pair.pids }

    /// Stops both nodes and removes their data directories.
    func stop() { pair.stop() }
}

/// The app of ``BenchRelay``: a TCP server on 127.0.0.1 (blocking sockets, a thread per connection) that
/// answers each 8-byte big-endian count with that many bytes of ``pattern``, and the clients that
/// check them.
final class RelayBenchApp: Sendable {
    /// The bytes every response cycles through (1 MiB, not periodic below that).
    static let pattern: [UInt8] = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: ($0 &* 2654435761) >> 13) }

    /// What a client measured.
    struct Transfer {
        var bytes: Int
        var seconds: Double
        var megabytesPerSecond: Double { Double(bytes) / seconds / 1_000_000 }
    }

    /// The most one client read takes from its socket.
    static let readSize = 256 << 10

    let port: Int
    private let listener: Int32

    /// Listens on 127.0.0.1, or with `anyAddress` on every address of the network namespace the calling
    /// thread is in (`bench links` reaches it across the lab's link and through the relay).
    init(anyAddress: Bool = false) throws {
        // Made now, so that no timed transfer pays for it.
        _ = Self.pattern.count
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw Self.failure("socket") }
        var on: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        var address = Self.loopback(port: 0)
        if anyAddress { address.sin_addr.s_addr = 0 }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(listener, 512) == 0 else {
            Glibc.close(listener)
            throw Self.failure("bind or listen")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        self.listener = listener
        Thread.detachNewThread {
            while true {
                let connection = accept(listener, nil, nil)
                if connection < 0 {
                    if errno == EINTR || errno == ECONNABORTED { continue }
                    return  // The listener was shut down.
                }
                Thread.detachNewThread { Self.serve(connection) }
            }
        }
    }

    /// Stops accepting (connections being served end with their clients).
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        Glibc.close(listener)
    }

    private static func serve(_ connection: Int32) {
        defer { Glibc.close(connection) }
        setNoDelay(connection)
        var request = [UInt8](repeating: 0, count: 8)
        while receiveExactly(connection, &request) {
            if request.starts(with: httpMethod) {
                serveHTTP(connection, received: request)
                return
            }
            var remaining = Int(request.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } & 0xFFFF_FFFF_FFFF)
            var offset = 0
            while remaining > 0 {
                let count = min(remaining, pattern.count - offset)
                let sent = pattern.withUnsafeBytes { send(connection, $0.baseAddress! + offset, count, Int32(MSG_NOSIGNAL)) }
                if sent < 0 && errno == EINTR { continue }
                guard sent > 0 else { return }
                remaining -= sent
                offset = (offset + sent) % pattern.count
            }
        }
    }

    /// `streams` connections at once, each asking for `bytes` and checking every byte; the time is from
    /// the first request to the last byte.
    static func transfer(host: UInt32 = RelayBenchApp.loopbackAddress, port: Int, bytes: Int, streams: Int) throws -> Transfer {
        var connections: [Int32] = []
        defer { for connection in connections { Glibc.close(connection) } }
        for _ in 0..<streams { connections.append(try connect(host: host, port: port)) }
        let failures = NIOLockedValueBox<[String]>([])
        let done = DispatchGroup()
        let start = ContinuousClock.now
        for connection in connections {
            done.enter()
            Thread.detachNewThread {
                defer { done.leave() }
                var buffer = [UInt8](repeating: 0, count: readSize)
                if let failure = fetch(connection, bytes: bytes, into: &buffer) { failures.withLockedValue { $0.append(failure) } }
            }
        }
        done.wait()
        let seconds = (ContinuousClock.now - start).seconds
        if let failure = failures.withLockedValue({ $0.first }) { throw ValidationError(failure) }
        return Transfer(bytes: bytes * streams, seconds: seconds)
    }

    /// The round trips (sorted, in milliseconds) of `requests` small requests on one connection to
    /// `host` (IPv4, host byte order), after `warmUp` untimed ones, and the bytes checked.
    static func roundTrips(host: UInt32 = RelayBenchApp.loopbackAddress, port: Int, responseBytes: Int, requests: Int,
                           warmUp: Int) throws -> (sortedMs: [Double], bytes: Int) {
        let connection = try connect(host: host, port: port)
        defer { Glibc.close(connection) }
        var buffer = [UInt8](repeating: 0, count: readSize)
        var times: [Double] = []
        times.reserveCapacity(requests)
        for index in 0..<(warmUp + requests) {
            let start = ContinuousClock.now
            if let failure = fetch(connection, bytes: responseBytes, into: &buffer) { throw ValidationError(failure) }
            if index >= warmUp { times.append((ContinuousClock.now - start).seconds * 1000) }
        }
        times.sort()
        return (times, responseBytes * (warmUp + requests))
    }

    /// Asks for `bytes` on `connection` and reads them, comparing each with the pattern: nil when all
    /// arrived intact, else what went wrong.
    private static func fetch(_ connection: Int32, bytes: Int, into buffer: inout [UInt8]) -> String? {
        var request = (0..<8).map { UInt8(truncatingIfNeeded: UInt64(bytes) >> (56 - 8 * $0)) }
        let sent = request.withUnsafeMutableBytes { send(connection, $0.baseAddress!, 8, Int32(MSG_NOSIGNAL)) }
        guard sent == 8 else { return "the request could not be sent: \(String(cString: strerror(errno)))" }
        var received = 0
        while received < bytes {
            let count = buffer.withUnsafeMutableBytes { recv(connection, $0.baseAddress!, min($0.count, bytes - received), 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else {
                return "the response ended after \(received) of \(bytes) bytes" + (count < 0 ? ": \(String(cString: strerror(errno)))" : "")
            }
            guard matchesPattern(buffer[..<count], at: received) else { return "byte \(received) or after differs from the pattern" }
            received += count
        }
        return nil
    }

    private static func matchesPattern(_ chunk: ArraySlice<UInt8>, at position: Int) -> Bool {
        chunk.withUnsafeBytes { chunkBytes in
            pattern.withUnsafeBytes { patternBytes in
                var done = 0
                while done < chunkBytes.count {
                    let offset = (position + done) % patternBytes.count
                    let count = min(chunkBytes.count - done, patternBytes.count - offset)
                    if memcmp(chunkBytes.baseAddress! + done, patternBytes.baseAddress! + offset, count) != 0 { return false }
                    done += count
                }
                return true
            }
        }
    }

    static func receiveExactly(_ connection: Int32, _ buffer: inout [UInt8]) -> Bool {
        var received = 0
        while received < buffer.count {
            let count = buffer.withUnsafeMutableBytes { recv(connection, $0.baseAddress! + received, $0.count - received, 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return false }
            received += count
        }
        return true
    }

    /// 127.0.0.1 in host byte order.
    static let loopbackAddress: UInt32 = 0x7F00_0001

    static func connect(host: UInt32 = RelayBenchApp.loopbackAddress, port: Int) throws -> Int32 {
        let connection = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard connection >= 0 else { throw failure("socket") }
        var address = loopback(port: port)
        address.sin_addr.s_addr = in_addr_t(host.bigEndian)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(connection, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            let error = failure("connecting to \(host >> 24).\(host >> 16 & 0xFF).\(host >> 8 & 0xFF).\(host & 0xFF):\(port)")
            Glibc.close(connection)
            throw error
        }
        setNoDelay(connection)
        return connection
    }

    static func setNoDelay(_ connection: Int32) {
        var on: Int32 = 1
        setsockopt(connection, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
    }

    static func loopback(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = in_addr_t(UInt32(0x7F00_0001).bigEndian)
        return address
    }

    static func failure(_ what: String) -> ValidationError {
        ValidationError("\(what) failed: \(String(cString: strerror(errno)))")
    }
}
