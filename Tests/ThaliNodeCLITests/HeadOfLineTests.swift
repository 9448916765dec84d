import Foundation
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// Issue 37, items 3 and 9: an item the receiver cannot hold must not hold the queue behind it, and both
/// sides say in words why it waits. Two real `thali-node run` processes on loopback; the receiver's
/// `partial/` is a small tmpfs in a mount namespace of the receiver's own (gone with the process,
/// whatever happens to the test).
@Suite("thali-node run: an item the receiver cannot hold", .serialized)
struct HeadOfLineTests {
    /// `thali-node run` for `person` on `ssdpPort`, with `partial/` on a tmpfs of `tmpfsMiB` when given.
    func run(_ person: TestPeople.Person, ssdpPort: Int, partialOnTmpfsMiB tmpfsMiB: Int? = nil) throws -> RunningPeer {
        let arguments = ["run", "--home", person.home.path, "--address", "127.0.0.1", "--ssdp-port", String(ssdpPort),
                         "--json", "--max-age", "5"]
        guard let tmpfsMiB else { return try RunningPeer(person.name, thaliNodeExecutable, arguments) }
        let quoted = arguments.map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " ")
        return try RunningPeer(person.name, "unshare", [
            "--mount", "sh", "-c",
            "mount -t tmpfs -o size=\(tmpfsMiB)m tmpfs '\(person.home.partialDirectory)' && exec '\(thaliNodeExecutable)' \(quoted)",
        ])
    }

    @Test("a 50 MiB file the receiver's 24 MiB disk cannot hold waits, the text queued after it arrives, and both sides say why in words")
    func fileTooBigForTheDiskDoesNotHoldTheText() async throws {
        let people = try TestPeople(["alice", "bob"], label: "hol")
        let (alice, bob) = (try people["alice"], try people["bob"])
        // A short first wait, so that the file is offered again while the test watches.
        try Data(#"{"noSpaceRetrySeconds": 2}"#.utf8).write(to: URL(fileURLWithPath: alice.home.configurationPath))
        let expiry = Date().addingTimeInterval(600)
        let path = alice.home.path + "/big.iso"
        #expect(FileManager.default.createFile(atPath: path, contents: nil))
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        // Its content does not matter (it is refused before a byte is sent); random bytes cost 20 s in debug.
        for _ in 0..<50 { try handle.write(contentsOf: Data(count: 1 << 20)) }
        try handle.close()
        let file = try alice.store.enqueueFile(at: path, to: "bob", expiresAt: expiry)
        let text = try alice.store.enqueueText("behind the big file", to: "bob", expiresAt: expiry.addingTimeInterval(1),
                                               now: Date().addingTimeInterval(1))

        let port = randomSSDPPort()
        let sender = try run(alice, ssdpPort: port)
        let receiver = try run(bob, ssdpPort: port, partialOnTmpfsMiB: 24)
        defer {
            sender.kill()
            receiver.kill()
        }
        // The text arrives although the file before it cannot.
        try await receiver.waitFor("the text", timeout: .seconds(60)) {
            $0.receivedItem?.id == text.id && $0.receivedItem?.text == "behind the big file"
        }
        try await sender.waitFor("the text acknowledged") { $0.deliveredID == text.id }

        // The receiver says what it refused and why: the free space, what it needs.
        let refused = try await receiver.waitFor("the refusal in words") {
            if case .delivery("alice", .refusedOffer(let item, .noSpace, _)) = $0 { item.id == file.id && item.fileName == "big.iso" } else { false }
        }
        guard case .delivery(_, .refusedOffer(_, _, let reason)) = refused else { return }
        #expect(reason.hasPrefix("not enough space: ") && reason.contains(" free in \(bob.home.partialDirectory)"), "\(reason)")
        #expect(reason.contains("82.0 MiB needed (50.0 MiB to come and 32.0 MiB kept free, minimumFreeBytes)"), "\(reason)")
        #expect(receiver.output.contains(#""size":52428800"#))

        // The sender says the file waits, why, and when it is offered again; it stays pending.
        let deferred = try await sender.waitFor("the deferral in words") {
            if case .delivery(_, .deferred(let item, .noSpace, _)) = $0 { item.id == file.id } else { false }
        }
        guard case .delivery(_, .deferred(_, _, let retryIn)) = deferred else { return }
        #expect(retryIn > .zero)
        #expect(String(decoding: try deferred.jsonLine(), as: UTF8.self).contains(#""reason":"not enough space""#))
        // The file is offered again later (the outbox poll wakes the advertisement at its retry time), and
        // refused again; the words of a refusal never name a Swift case.
        try await receiver.waitFor("a second offer of the file", timeout: .seconds(90)) { _ in
            receiver.events.filter { if case .delivery(_, .refusedOffer(let item, _, _)) = $0 { item.id == file.id } else { false } }.count >= 2
        }
        for event in sender.events + receiver.events where ["deferred", "refused_offer"].contains(event.name) {
            let line = String(decoding: try event.jsonLine(), as: UTF8.self)
            #expect(!line.contains("noSpace") && !line.contains("ItemRefusal"), "\(line)")
        }

        #expect(sender.kill(signal: SIGTERM) == 0)
        #expect(receiver.kill(signal: SIGTERM) == 0)
        // The readable lines, as a person sees them (`--json` off): the same words.
        let kept = try #require(try alice.store.outboxItem(id: file.id))
        #expect(kept.state == .pending)
        let problem = try #require(kept.lastError)
        #expect(problem.hasPrefix("bob cannot hold it now: not enough space; offered again in "), "\(problem)")
        #expect(try alice.store.outboxItem(id: text.id) == nil)
        #expect(try people.inbox(of: "bob").map(\.id) == [text.id])
        let summary = PeerEventRecord(.delivery(contact: .sample("bob"), .deferred(
            ItemOffer(id: file.id, kind: .file, size: 50 << 20, sha256: Array(repeating: 0, count: 32), createdMilliseconds: 0,
                      expiresMilliseconds: 1, name: "big.iso"), .noSpace, retryIn: .seconds(30))))?.summary
        #expect(summary == #"bob cannot hold "big.iso" (50.0 MiB) now: not enough space; offered again in 30 s"#)
    }
}
