import Foundation
import NIOCore
import NIOPosix
import Testing
import ThaliTestSupport

@testable import ThaliSSDP

/// Independent SSDP implementations against ours: gssdp (GNOME's, in gupnp-tools), async-upnp-client
/// (Home Assistant's), and a foreign device written in Python.
@Suite("Real SSDP peers", .serialized)
struct RealPeerTests {
    static let nt = ThaliServiceName.notificationType

    /// gssdp only speaks on port 1900, so these run in a network namespace of their own.
    @Test(.enabled(if: TestEnvironment.available(canUseNetworkNamespaces && ChildProcess.which("gssdp-discover") != nil && thaliNodePath() != nil)))
    func gssdpSeesOurAnnouncementsAndByebye() async throws {
        let namespace = try NetworkNamespace("thali-ssdp-\(getpid())-g1")
        let node = try namespace.spawn(try #require(thaliNodePath()),
                                       ["discover", "--interface-address", "127.0.0.1", "--beacons-hex", "0102"])
        let started = try await waitForLine(node, "started") { $0.event == "started" }
        let usn = try #require(started.usn)
        let location = try #require(started.location)
        let gssdp = try namespace.spawn("gssdp-discover", ["-i", "lo", "-t", Self.nt, "-m", "all", "-n", "6"])
        try await gssdp.waitForOutput(containing: "USN:      \(usn)", timeout: .seconds(3))
        #expect(gssdp.output.contains("resource available"))
        #expect(gssdp.output.contains("Location: \(location)"))
        node.write("stop\n")
        try await gssdp.waitForOutput(containing: "resource unavailable", timeout: .seconds(3))
        try await gssdp.waitForExit(timeout: .seconds(8))
        try await node.waitForExit()
    }

    @Test(.enabled(if: TestEnvironment.available(canUseNetworkNamespaces && ChildProcess.which("gssdp-discover") != nil && thaliNodePath() != nil)))
    func gssdpsSearchIsAnsweredByUnicast() async throws {
        let namespace = try NetworkNamespace("thali-ssdp-\(getpid())-g2")
        // Background mode: one alive at start, the next only after 60 s; gssdp starts after the first.
        let node = try namespace.spawn(try #require(thaliNodePath()),
                                       ["discover", "--interface-address", "127.0.0.1", "--beacons-hex", "0102", "--background"])
        let started = try await waitForLine(node, "started") { $0.event == "started" }
        let usn = try #require(started.usn)
        // `started` is printed once start() returned, by when its one alive is on the wire: gssdp misses it.
        let gssdp = try namespace.spawn("gssdp-discover", ["-i", "lo", "-t", Self.nt, "-n", "6"])
        try await gssdp.waitForOutput(containing: "USN:      \(usn)", timeout: .seconds(6))
        node.write("stop\n")
        let stopped = try await waitForLine(node, "stopped") { $0.event == "stopped" }
        let counters = try #require(stopped.counters)
        #expect(counters["search_responses_sent"] ?? 0 >= 1)
        #expect(counters["alives_sent"] == 1)  // so gssdp learnt of us from the search answer
    }

    @Test(.enabled(if: TestEnvironment.available(ChildProcess.testVenvPython(packageRoot: PackagePaths.root()) != nil)))
    func asyncUpnpClientSeesOurAlivesAndOurSearchAnswer() async throws {
        // Beside the venv's python, which honours THALI_TEST_VENV as the enabling condition does.
        let python = try #require(ChildProcess.testVenvPython(packageRoot: PackagePaths.root()))
        let upnpClient = URL(fileURLWithPath: python).deletingLastPathComponent().appendingPathComponent("upnp-client").path
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.foregroundAliveInterval = .milliseconds(300)
        let service = SSDPDiscoveryService(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton)
        try await service.start(advertising: [5])
        let usn = try #require(await service.uniqueServiceName())
        let location = (await service.location()).description

        let listener = try ChildProcess(upnpClient, ["--timeout", "2", "advertisements", "--bind", "127.0.0.1",
                                                     "--target", "239.255.255.250", "--target_port", String(port)])
        try await listener.waitForOutput(containing: "\"USN\": \"\(usn)\"", timeout: .seconds(4))
        #expect(listener.output.contains("\"NTS\": \"ssdp:alive\""))
        #expect(listener.output.contains("\"LOCATION\": \"\(location)\""))
        #expect(listener.output.contains("\"CACHE-CONTROL\": \"max-age=60\""))
        listener.terminate()

        let searcher = try ChildProcess(upnpClient, ["--timeout", "4", "search", "--bind", "127.0.0.1",
                                                     "--target", "239.255.255.250", "--target_port", String(port),
                                                     "--search_target", Self.nt])
        try await searcher.waitForExit(timeout: .seconds(8))
        #expect(searcher.output.contains("\"USN\": \"\(usn)\""))
        #expect(searcher.output.contains("\"_source\": \"SsdpSource.SEARCH\""))
        #expect(await service.counters().searchResponsesSent >= 1)
        await service.stop()
    }

    /// A UPnP device in Python on the same group: announces itself, and answers every M-SEARCH (even ours,
    /// whose target it does not offer, as sloppy devices do). Our searcher must see it and track nothing.
    @Test func ourSearcherIgnoresAForeignAnnouncer() async throws {
        let port = try freeUDPPort()
        let script = """
            import socket, struct, sys, time
            port = int(sys.argv[1])
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("239.255.255.250", port))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                         socket.inet_aton("239.255.255.250") + socket.inet_aton("127.0.0.1"))
            print("listening", flush=True)
            out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            out.bind(("127.0.0.1", 0))
            out.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
            loc = "http://127.0.0.1:%d/rootDesc.xml" % out.getsockname()[1]
            usn = "uuid:11111111-2222-3333-4444-555555555555::upnp:rootdevice"
            notify = ("NOTIFY * HTTP/1.1\\r\\nHOST: 239.255.255.250:%d\\r\\nNT: upnp:rootdevice\\r\\nNTS: ssdp:alive\\r\\n"
                      "USN: %s\\r\\nLOCATION: %s\\r\\nCACHE-CONTROL: max-age=1800\\r\\nSERVER: Linux/5 UPnP/1.0 router/1\\r\\n\\r\\n"
                      % (port, usn, loc)).encode()
            out.sendto(notify, ("239.255.255.250", port))
            s.settimeout(10)
            while True:
                data, source = s.recvfrom(2048)
                text = data.decode("ascii", "replace")
                if text.startswith("M-SEARCH"):
                    print("SEARCH " + text.replace("\\r\\n", "|"), flush=True)
                    out.sendto(("HTTP/1.1 200 OK\\r\\nCACHE-CONTROL: max-age=1800\\r\\nEXT:\\r\\nLOCATION: %s\\r\\n"
                                "ST: upnp:rootdevice\\r\\nUSN: %s\\r\\n\\r\\n" % (loc, usn)).encode(), source)
                    out.sendto(notify, ("239.255.255.250", port))  # and announces itself again
                    print("answered", flush=True)
            """
        let device = try ChildProcess("/usr/bin/python3", ["-c", script, String(port)])
        // The device is in the group before we speak.
        try await device.waitForOutput(containing: "listening", timeout: .seconds(5))
        let service = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port),
                                           group: MultiThreadedEventLoopGroup.singleton)
        try await service.start(advertising: [1])
        try await device.waitForOutput(containing: "answered", timeout: .seconds(5))
        let usn = try #require(await service.uniqueServiceName())
        // Our M-SEARCH as the device received it: MAN, MX, ST = our NT, S = our USN.
        let search = try #require(device.output.split(separator: "\n").first { $0.hasPrefix("SEARCH ") })
        #expect(search.contains("|MAN: \"ssdp:discover\"|"))
        #expect(search.contains("|MX: 1|"))
        #expect(search.contains("|ST: \(Self.nt)|"))
        #expect(search.contains("|S: \(usn)|"))
        // Its NOTIFY and its answer, both read: neither made a peer.
        try await eventually("the device's alive and answer are counted as foreign") {
            await service.counters().foreignMessagesIgnored >= 2
        }
        let counters = await service.counters()
        #expect(counters.malformedDatagrams == 0)
        #expect(await service.peers().isEmpty)
        await service.stop()
        device.terminate()
    }
}
