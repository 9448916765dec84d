import Foundation
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
        let started = try await alicePeer.waitFor("started") { isEvent($0, "started") }
        #expect((started["location"] as? String)?.hasPrefix("http://127.0.0.1:") == true)
        try await bobPeer.waitFor("the file") { isEvent($0, "received", ["id": file.id.uuidString, "contact": "alice"]) }
        try await bobPeer.waitFor("the text") { isEvent($0, "received", ["id": toBob.id.uuidString, "text": "hello bob"]) }
        try await alicePeer.waitFor("bob's text") { isEvent($0, "received", ["id": toAlice.id.uuidString]) }
        try await alicePeer.waitFor("the file acknowledged") { isEvent($0, "delivered", ["id": file.id.uuidString]) }
        try await bobPeer.waitFor("a status line") { isEvent($0, "status") && ($0["inbox"] as? Int) == 2 }

        #expect(alicePeer.kill(signal: SIGTERM) == 0)
        #expect(bobPeer.kill(signal: SIGINT) == 0)
        #expect(alicePeer.events.contains { isEvent($0, "stopped", ["reason": "SIGTERM"]) })
        #expect(bobPeer.events.contains { isEvent($0, "stopped", ["reason": "SIGINT"]) })
        #expect(try people.inbox(of: "bob").map(\.id).sorted { $0.uuidString < $1.uuidString }
                == [toBob.id, file.id].sorted { $0.uuidString < $1.uuidString })
        #expect(try people.inbox(of: "alice").map(\.id) == [toAlice.id])
        let received = try #require(try bob.store.inbox().first { $0.itemID == file.id })
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(received.filePath))) == content)
        #expect(try alice.store.outbox().isEmpty && bob.store.outbox().isEmpty)
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
                                     containing: "port \(port) on 127.0.0.1 is in use by another process")
        try await holder.close()
    }

    @Test("run on a missing interface or an address no interface has says so")
    func noUsableInterface() async throws {
        let people = try TestPeople(["erin"], label: "run-if")
        let home = try people["erin"].home.path
        try await expectOneLineError(["run", "--home", home, "--interface", "nosuch0"],
                                     containing: "network interface \"nosuch0\" is missing, down or has no IPv4 address")
        try await expectOneLineError(["run", "--home", home, "--address", "192.0.2.77"],
                                     containing: "network interface \"192.0.2.77\" is missing")
    }
}
