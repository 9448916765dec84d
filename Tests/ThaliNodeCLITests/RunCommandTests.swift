import Foundation
import ThaliSSDP
import ThaliPSKTLS
import ThaliBeacons
import NIOCore
import NIOPosix
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// `thali-node run` as users run it: separate processes on loopback, multicast pinned to 127.0.0.1.
@Suite("thali-node run", .serialized)
struct RunCommandTests {
    func run(_ person: TestPeople.Person, port ssdpPort: Int, _ extra: [String] = []) throws -> RunningPeer {
        try RunningPeer(person.name, thaliNodeExecutable, [
            "run", "--home", person.home.path, "--address", "127.0.0.1", "--ssdp-port", String(ssdpPort), "--json",
            "--max-age", "5",
        ] + extra)
    }

    @Test("two processes on loopback deliver each other's texts and a file, then stop cleanly on SIGTERM")
    func twoProcessesOnLoopback() async throws {
        let people = try TestPeople(["alice", "bob"], label: "run2")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let expiry = Date().addingTimeInterval(600)
        let toBob = try alice.store.enqueueText("hello bob", to: "bob", expiresAt: expiry)
        let path = alice.home.path + "/notes.bin"
        let content = Data(randomBytes(200_000))
        try content.write(to: URL(fileURLWithPath: path))
        let file = try alice.store.enqueueFile(at: path, to: "bob", expiresAt: expiry)
        let toAlice = try bob.store.enqueueText("hello alice", to: "alice", expiresAt: expiry)

        let port = randomSSDPPort()
        let alicePeer = try run(alice, port: port), bobPeer = try run(bob, port: port, ["--status-interval", "0.5"])
        let started = try await alicePeer.waitFor("started") { $0.isStarted }
        #expect(started.startedLocation?.description.hasPrefix("http://127.0.0.1:") == true)
        try await bobPeer.waitFor("the file") { $0.receivedItem?.id == file.id && $0.contact?.name == "alice" }
        try await bobPeer.waitFor("the text") { $0.receivedItem?.id == toBob.id && $0.receivedItem?.text == "hello bob" }
        try await alicePeer.waitFor("bob's text") { $0.receivedItem?.id == toAlice.id }
        try await alicePeer.waitFor("the file acknowledged") { $0.deliveredID == file.id }
        try await bobPeer.waitFor("a status line") { $0.statusSnapshot?.inbox == 2 }

        #expect(alicePeer.kill(signal: SIGTERM) == 0)
        #expect(bobPeer.kill(signal: SIGINT) == 0)
        #expect(alicePeer.events.contains { $0.stopReason == "SIGTERM" })
        #expect(bobPeer.events.contains { $0.stopReason == "SIGINT" })
        #expect(try people.inbox(of: "bob").map(\.id).sorted { $0.uuidString < $1.uuidString }
                == [toBob.id, file.id].sorted { $0.uuidString < $1.uuidString })
        #expect(try people.inbox(of: "alice").map(\.id) == [toAlice.id])
        let received = try #require(try bob.store.inbox().first { $0.itemID == file.id })
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(received.filePath))) == content)
        #expect(try alice.store.outbox().isEmpty && bob.store.outbox().isEmpty)
    }

    @Test("a contact's node that hangs after authenticating is reported as silent within the idle timeout and retried; the file arrives once it runs again")
    func hungSenderIsNoticedAndRetried() async throws {
        let people = try TestPeople(["alice", "bob"], label: "stall")
        let (alice, bob) = (try people["alice"], try people["bob"])
        // Alice gives a silent delivery stream 2 s (60 s by default).
        try Data(#"{"idleTimeoutSeconds": 2}"#.utf8).write(to: URL(fileURLWithPath: alice.home.configurationPath))
        let path = bob.home.path + "/big.bin"
        let content = Data(randomBytes(3 << 20))
        try content.write(to: URL(fileURLWithPath: path))
        let file = try bob.store.enqueueFile(at: path, to: "alice", expiresAt: Date().addingTimeInterval(600))

        let port = randomSSDPPort()
        // Bob sends at 256 KiB/s: the transfer is under way for seconds, long enough to freeze him in it.
        let alicePeer = try run(alice, port: port), bobPeer = try run(bob, port: port, ["--throttle", "262144"])
        defer {
            kill(bobPeer.pid, SIGCONT)
            alicePeer.kill()
            bobPeer.kill()
        }
        try await alicePeer.waitFor("the file's first bytes") { $0.progress?.id == file.id }
        kill(bobPeer.pid, SIGSTOP)
        let stalled = try await alicePeer.waitFor("the stall reported", timeout: .seconds(20)) {
            if case .connectionFailed("bob", let reason, _) = $0 { reason.contains("went silent") } else { false }
        }
        guard case .connectionFailed(_, let reason, _) = stalled else { return }
        #expect(reason.contains("nothing sent or received for 2000 ms"), "\(stalled)")
        #expect(!alicePeer.events.contains { $0.receivedItem?.id == file.id })
        kill(bobPeer.pid, SIGCONT)

        do {
            try await alicePeer.waitFor("the file after the retry", timeout: .seconds(60)) {
                $0.receivedItem?.id == file.id
            }
        } catch {
            // Why the retries failed is on the sender's side (once: it kept its stalled session's claim).
            Issue.record("bob's output:\n\(bobPeer.output)")
            throw error
        }
        try await bobPeer.waitFor("the file acknowledged", timeout: .seconds(30)) {
            $0.deliveredID == file.id
        }
        let received = try #require(try alice.store.inbox().first { $0.itemID == file.id })
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(received.filePath))) == content)
        #expect(try people.inbox(of: "alice").map(\.id) == [file.id])
    }

    @Test("the demo (README's first command) runs three peers, verifies every inbox and cleans up")
    func demo() async throws {
        func demoDirectories() throws -> Set<String> {
            Set(try FileManager.default.contentsOfDirectory(atPath: FileManager.default.temporaryDirectory.path)
                .filter { $0.hasPrefix("thali-demo-") })
        }
        let before = try demoDirectories()
        let executable = thaliNodeExecutable
        let result = try await Task.detached {
            try ChildProcess.run(executable, ["demo", "--pace", "0", "--timeout", "45"], timeout: .seconds(60))
        }.value
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("6 of 6 items verified in the right inbox, exactly once, content intact"), "\(result.output)")
        #expect(result.output.contains("Every item reached its contact, and only its contact."))
        #expect(try demoDirectories().subtracting(before).isEmpty, "the demo left its data directories behind")
    }

    @Test("demo --json prints only its summary: one object saying every item arrived, per peer and per step")
    func demoJSON() async throws {
        let summary = try await thaliNodeJSONObject(["demo", "--json", "--pace", "0", "--timeout", "45"])
        #expect(summary["ok"] as? Bool == true && summary["items"] as? Int == 6 && summary["verified"] as? Int == 6)
        #expect(summary["failure"] == nil && summary["kept_under"] == nil)
        let peers = try #require(summary["peers"] as? [[String: Any]])
        #expect(peers.map { $0["name"] as? String } == ["Alice", "Bob", "Carol"])
        #expect(peers.allSatisfy { $0["inbox"] as? Int == 2 && $0["outbox_left"] as? Int == 0 })
        let timings = try #require(summary["timings"] as? [[String: Any]])
        #expect(timings.contains { ($0["step"] as? String)?.hasPrefix("stop the 3 peers cleanly") == true && $0["s"] is Double })
    }

    func expectOneLineError(_ arguments: [String], containing text: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let executable = thaliNodeExecutable
        let result = try await Task.detached { try ChildProcess.run(executable, arguments, timeout: .seconds(20)) }.value
        #expect(result.status != 0, "\(result.output)", sourceLocation: sourceLocation)
        let lines = result.output.split(separator: "\n")
        #expect(lines.count == 1, "\(result.output)", sourceLocation: sourceLocation)
        #expect(result.output.contains(text), "\(result.output)", sourceLocation: sourceLocation)
    }

    @Test("run without an identity says how to make one")
    func missingIdentity() async throws {
        let temporary = TemporaryHome("run-noid")
        try temporary.home.create()
        try await expectOneLineError(["run", "--home", temporary.home.path, "--address", "127.0.0.1"],
                                     containing: "no identity at \(temporary.home.identityPath)")
    }

    @Test("run with an unreadable configuration names the file and the problem")
    func unreadableConfiguration() async throws {
        let people = try TestPeople(["carol"], label: "run-config")
        let home = try people["carol"].home
        try Data("{ \"ssdpPort\": ".utf8).write(to: URL(fileURLWithPath: home.configurationPath))
        try await expectOneLineError(["run", "--home", home.path, "--address", "127.0.0.1"], containing: home.configurationPath)
        try Data("{ \"ssdpPrt\": 1900 }".utf8).write(to: URL(fileURLWithPath: home.configurationPath))
        try await expectOneLineError(["run", "--home", home.path, "--address", "127.0.0.1"], containing: "ssdpPrt")
    }

    @Test("run on a port another process holds says so")
    func busyPort() async throws {
        let people = try TestPeople(["dave"], label: "run-port")
        let holder = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(holder.localAddress?.port)
        try await expectOneLineError(["run", "--home", try people["dave"].home.path, "--address", "127.0.0.1",
                                      "--ssdp-port", String(randomSSDPPort()), "--port", String(port)],
                                     containing: "port \(port) on 127.0.0.1 is in use")
        try await holder.close()
    }

    @Test("--relay-port takes NAME=PORT for a known contact")
    func relayPortOption() async throws {
        let people = try TestPeople(["erin", "frank"], label: "run-relay-port")
        let base = ["run", "--home", try people["erin"].home.path, "--address", "127.0.0.1", "--ssdp-port", String(randomSSDPPort())]
        try await expectOneLineError(base + ["--app-port", "5984", "--relay-port", "frank"], containing: "give a contact and a port, as NAME=PORT")
        try await expectOneLineError(base + ["--app-port", "5984", "--relay-port", "frank=70000"], containing: "the port must be in 1...65535")
        try await expectOneLineError(base + ["--app-port", "5984", "--relay-port", "frank=6000", "--relay-port", "frank=6001"],
                                     containing: "two ports given for frank")
        try await expectOneLineError(base + ["--app-port", "5984", "--relay-port", "gina=6000"], containing: "unknown contact \"gina\"")
    }

    @Test("an adapter name is taken only right after --bluetooth, and only one")
    func bluetoothAdapterArgument() async throws {
        let people = try TestPeople(["fay"], label: "run-bt")
        let home = try people["fay"].home.path
        try await expectOneLineError(["run", "--home", home, "hci1"],
                                     containing: "unexpected argument 'hci1': an adapter name follows --bluetooth")
        try await expectOneLineError(["run", "--home", home, "--bluetooth", "hci1", "--adapter", "hci2"],
                                     containing: "two adapters given: 'hci1' and --adapter 'hci2'")
    }

    /// Whether this machine's kernel refuses Bluetooth sockets (as the test machines' kernels do).
    static let kernelLacksBluetooth: Bool = {
        let fd = socket(31 /* AF_BLUETOOTH */, Int32(SOCK_STREAM.rawValue), 3 /* BTPROTO_RFCOMM */)
        if fd >= 0 { close(fd); return false }
        return errno == EAFNOSUPPORT
    }()

    @Test("on a kernel without Bluetooth, --bluetooth alone fails in one line naming the kernel; beside Wi-Fi it is one event and Wi-Fi runs",
          .enabled(if: kernelLacksBluetooth))
    func kernelWithoutBluetooth() async throws {
        let people = try TestPeople(["gus"], label: "run-bt-kernel")
        let home = try people["gus"].home.path
        let kernelLine = "this kernel has no Bluetooth sockets: socket(AF_BLUETOOTH, SOCK_STREAM, BTPROTO_RFCOMM) failed with EAFNOSUPPORT"
        try await expectOneLineError(["run", "--home", home, "--bluetooth", "--no-wifi"],
                                     containing: "error: Bluetooth cannot run: \(kernelLine)")
        let peer = try RunningPeer("gus", thaliNodeExecutable, [
            "run", "--home", home, "--address", "127.0.0.1", "--ssdp-port", String(randomSSDPPort()), "--json", "--bluetooth",
        ])
        let unavailable = try await peer.waitFor("binding_unavailable") {
            if case .bindingUnavailable(.bluetooth, _) = $0 { true } else { false }
        }
        guard case .bindingUnavailable(_, let reason) = unavailable else { return }
        #expect(reason.hasPrefix(kernelLine), "\(unavailable)")
        let started = try await peer.waitFor("started") { $0.isStarted }
        let location = try #require(started.startedLocation).description
        #expect(location.hasPrefix("http://127.0.0.1:"))
        // Wi-Fi runs: the peer serves its beacons.
        let fetch = try ChildProcess.run("curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", location])
        #expect(["200", "204"].contains(fetch.output.trimmingCharacters(in: .whitespacesAndNewlines)), "\(fetch.output)")
        #expect(!peer.hasExited)
        #expect(peer.kill(signal: SIGINT) == 0)
    }

    @Test("run on a missing interface or an address no interface has says so")
    func noUsableInterface() async throws {
        let people = try TestPeople(["erin"], label: "run-if")
        let home = try people["erin"].home.path
        try await expectOneLineError(["run", "--home", home, "--interface", "nosuch0"],
                                     containing: "network interface \"nosuch0\" is missing, down or has no IPv4 address")
        try await expectOneLineError(["run", "--home", home, "--address", "192.0.2.77"],
                                     containing: "address \"192.0.2.77\" cannot be used: no local interface has it")
        try await expectOneLineError(["run", "--home", home, "--address", "not-an-ip"],
                                     containing: "--address 'not-an-ip' is not an IPv4 address")
    }
}

/// What a session looks like from the outside (issue 10): every connected session gets an end event with
/// its reason, the DH group is the configuration's, and the status names matched contacts as such.
@Suite("thali-node run: sessions", .serialized, .timeLimit(.minutes(1)))
struct RunSessionTests {
    @Test("a PSK-TLS session that never opens a stream, and one ending in a multiplexer protocol error, each end with a reason")
    func everySessionEnds() async throws {
        let people = try TestPeople(["alice", "bob"], label: "run-ends")
        let (alice, bob) = (try people["alice"], try people["bob"])
        _ = try alice.store.enqueueText("for bob", to: "bob", expiresAt: Date().addingTimeInterval(600))
        try Data("{ \"dhGroup\": \"ffdhe3072\" }".utf8).write(to: URL(fileURLWithPath: alice.home.configurationPath))
        let alicePeer = try RunningPeer("alice", thaliNodeExecutable, [
            "run", "--home", alice.home.path, "--address", "127.0.0.1", "--ssdp-port", String(randomSSDPPort()),
            "--json", "--status-interval", "0.3",
        ])
        defer { alicePeer.kill() }
        let started = try await alicePeer.waitFor("started") { $0.isStarted }
        guard case .wifi(let location) = try #require(started.startedLocation) else {
            Issue.record("not a Wi-Fi location: \(started)")
            return
        }
        // The test plays Bob: it fetches Alice's beacons and connects with the PSK of the one for him.
        try await alicePeer.waitFor("advertising") { $0 == .advertising(contacts: ["bob"]) }
        var client = BeaconHTTPClientConfiguration()
        client.maxAttempts = 3
        let stream = try await BeaconHTTPClient(configuration: client, group: MultiThreadedEventLoopGroup.singleton).fetch(location)
        let receiver = BeaconReceiver(identity: bob.key)
        try receiver.addressBook.add(alice.key.publicKey)
        let match = try receiver.receive(stream, from: location.description)

        // 1. Handshake, then close without opening a stream.
        let quiet = try await PSKTLSClient.connect(host: location.host, port: location.port,
                                                   identity: match.pskIdentity, psk: match.psk)
        #expect(quiet.parameters.dhGroupBits == 3072, "the configuration's dhGroup")
        try await quiet.executeThenClose { _, _ in }
        func ended(_ event: NodeEvent) -> (role: PeerEvent.Role, reason: String)? {
            if case .disconnected("bob", let role, _, _, let reason) = event { (role, reason ?? "closed") } else { nil }
        }
        let first = try await alicePeer.waitFor("the first session's end") { ended($0) != nil }
        #expect(ended(first)?.reason.isEmpty == false)

        // 2. Handshake, then bytes that are no yamux frame: a protocol error ends the session.
        let broken = try await PSKTLSClient.connect(host: location.host, port: location.port,
                                                    identity: match.pskIdentity, psk: match.psk)
        try await broken.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(bytes: [0x07, 0, 0, 0] + Array(repeating: 0, count: 8)))
            for try await _ in inbound {}
        }
        let ends = try await alicePeer.waitFor("the second session's end") {
            ended($0)?.reason.contains("unsupported yamux version 7") == true
        }
        #expect(ended(ends)?.role == .accepting)
        let connected = alicePeer.events.filter { if case .connected("bob", _, _, _) = $0 { true } else { false } }.count
        let disconnected = alicePeer.events.filter { ended($0) != nil }.count
        #expect(connected == 2 && disconnected == 2, "one end per session")

        // The status names the list for what it is: contacts whose beacons matched (none here).
        let status = try await alicePeer.waitFor("status") { $0.statusSnapshot != nil }
        #expect(status.statusSnapshot?.matchedContacts == [])
        // Its line (written back as it came: NodeEventTests) has no list called `contacts`.
        let statusLine = String(decoding: try status.jsonLine(), as: UTF8.self)
        #expect(statusLine.contains(#""matched_contacts":[]"#) && !statusLine.contains(#""contacts""#), "\(statusLine)")
        #expect(alicePeer.kill() == 0)
    }
    @Test("a peer stopped in the middle of receiving a file says so in words")
    func stopMidSessionInWords() async throws {
        let people = try TestPeople(["alice", "bob"], label: "run-stop-mid")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let path = alice.home.path + "/big.bin"
        try Data(randomBytes(1 << 20)).write(to: URL(fileURLWithPath: path))
        _ = try alice.store.enqueueFile(at: path, to: "bob", expiresAt: Date().addingTimeInterval(600))
        let ssdpPort = String(randomSSDPPort())
        let alicePeer = try RunningPeer("alice", thaliNodeExecutable, [
            "run", "--home", alice.home.path, "--address", "127.0.0.1", "--ssdp-port", ssdpPort, "--json", "--throttle", "262144",
        ])
        defer { alicePeer.kill(signal: SIGKILL) }  // its paced writes would hold a clean stop for seconds
        let bobPeer = try RunningPeer("bob", thaliNodeExecutable, [
            "run", "--home", bob.home.path, "--address", "127.0.0.1", "--ssdp-port", ssdpPort,
        ])
        defer { bobPeer.kill() }
        try await alicePeer.waitFor("the transfer") { $0.progress != nil && $0.contact?.name == "bob" }
        #expect(bobPeer.kill(signal: SIGTERM) == 0)
        let lines = bobPeer.output.split(separator: "\n")
        // Bob's stop cancels the session (or closes its connection first): either way, said in words.
        let ended = lines.filter { $0.contains("session with alice ended: connection with 127.0.0.1:") }
        #expect(ended.count == 1 && ended.allSatisfy { $0.hasSuffix(" closed: this peer stopped") || $0.hasSuffix(" closed the connection") },
                "\(bobPeer.output)")
        for marker in ["Error(", "Failure(", "NIO", "IOError", "errno", "ThaliNodeCore.", "TCPMultiplexer."] {
            #expect(!lines.contains { $0.contains(marker) }, "\(marker) in:\n\(bobPeer.output)")
        }
    }

    @Test("a refused connection, and a stop during the retry, print words: no type names, no library descriptions")
    func refusedConnectionInWords() async throws {
        let people = try TestPeople(["alice", "bob"], label: "run-refused")
        let ssdpPort = randomSSDPPort()
        // Alice's announcement for Bob, served from a port that closes at Bob's first PSK-TLS attempt:
        // that attempt ends closed, every later one is refused.
        let host = try await AnnouncementCopyHost(copying: people["alice"], for: people["bob"], ssdpPort: ssdpPort) { channel in
            channel.parent?.close(promise: nil)
            return channel.close()
        }
        defer { Task { await host.stop() } }
        let port = try #require(host.listener.localAddress?.port)
        let bob = try RunningPeer("bob", thaliNodeExecutable, [
            "run", "--home", people["bob"].home.path, "--address", "127.0.0.1", "--ssdp-port", String(ssdpPort),
        ])
        defer { bob.kill() }
        let refused = "connection with alice failed: connection refused by 127.0.0.1:\(port); retrying in "
        _ = try? await bob.waitForOutputLine(containing: refused)
        #expect(bob.output.contains(refused), "\(bob.output)")
        #expect(bob.kill() == 0)
        let lines = bob.output.split(separator: "\n")
        for marker in ["Error(", "Failure(", "NIO", "IOError", "errno", "ThaliNodeCore.", "TCPMultiplexer."] {
            #expect(!lines.contains { $0.contains(marker) }, "\(marker) in:\n\(bob.output)")
        }
    }
}
