import Foundation
import Testing
import ThaliTestSupport

@testable import ThaliSSDP

/// Three hosts: three network namespaces whose `eth0`s are veth ends plugged into a bridge that lives in
/// a fourth namespace. Addresses exist only inside them; all of it is deleted when the test ends.
final class BridgedHosts: @unchecked Sendable {
    let bridge: NetworkNamespace
    let hosts: [NetworkNamespace]
    let addresses: [String]

    init(prefix: String, count: Int) throws {
        bridge = try NetworkNamespace("\(prefix)br")
        try bridge.run("ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        try bridge.run("ip", "link", "set", "br0", "up")
        var hosts: [NetworkNamespace] = []
        var addresses: [String] = []
        for index in 0..<count {
            let host = try NetworkNamespace("\(prefix)h\(index)")
            let address = "10.213.7.\(index + 1)"
            try bridge.run("ip", "link", "add", "v\(index)", "type", "veth", "peer", "name", "eth0", "netns", host.name)
            try bridge.run("ip", "link", "set", "v\(index)", "master", "br0", "up")
            try host.run("ip", "addr", "add", "\(address)/24", "dev", "eth0")
            try host.run("ip", "link", "set", "eth0", "up")
            hosts.append(host)
            addresses.append(address)
        }
        self.hosts = hosts
        self.addresses = addresses
    }
}

@Suite("Discovery across three hosts", .serialized)
struct MultiHostTests {
    @Test(.enabled(if: TestEnvironment.available(canUseNetworkNamespaces && thaliNodePath() != nil)))
    func threePeersDiscoverEachOtherAndSeeByebyeAndExpiry() async throws {
        let node = try #require(thaliNodePath())
        let network = try BridgedHosts(prefix: "tssdp\(getpid())", count: 3)
        let beacons = ["a1a1", "b2b2b2", "c3"]
        var peers: [ChildProcess] = []
        defer { peers.forEach { $0.terminate(signal: SIGKILL) } }
        for (index, host) in network.hosts.enumerated() {
            peers.append(try host.spawn(node, [
                "discover", "--interface-address", network.addresses[index], "--beacons-hex", beacons[index],
                "--max-age", "2", "--alive-interval-ms", "500",
            ]))
        }
        var locations: [String] = []
        for peer in peers {
            let started = try await waitForLine(peer, "started") { $0.event == "started" }
            locations.append(try #require(started.location))
        }
        #expect(locations.enumerated().allSatisfy { $0.element.hasPrefix("http://\(network.addresses[$0.offset]):") })

        // Each peer fetches the other two's beacons within 2 s.
        for (index, peer) in peers.enumerated() {
            for other in 0..<3 where other != index {
                try await waitForLine(peer, timeout: .seconds(2), "peer \(index) fetches \(other)") {
                    $0.event == "beacons" && $0.location == locations[other]
                        && $0.beaconsHex == beacons[other]
                }
            }
        }

        // A clean stop of peer 0 reaches the others as byebye.
        peers[0].write("stop\n")
        for index in [1, 2] {
            try await waitForLine(peers[index], timeout: .seconds(2), "peer \(index) sees 0 say byebye") {
                $0.event == "left" && $0.location == locations[0]
                    && $0.reason == "byebye"
            }
        }
        try await peers[0].waitForExit()

        // SIGKILL peer 2: no byebye; peer 1 forgets it when max-age (2 s) runs out.
        peers[2].terminate(signal: SIGKILL)
        let left = try await waitForLine(peers[1], timeout: .seconds(4), "peer 1 sees 2 expire") {
            $0.event == "left" && $0.location == locations[2]
        }
        #expect(left.reason == "expired")

        peers[1].write("stop\n")
        let stopped = try await waitForLine(peers[1], "peer 1 stops") { $0.event == "stopped" }
        let counters = try #require(stopped.counters)
        #expect(counters["spoofed_locations_ignored"] == 0 && counters["malformed_datagrams"] == 0)
        #expect(counters["beacon_fetches_succeeded"] == 2)  // once per USN, despite an alive every 500 ms
    }
}
