// An app embedding the Thali peer: two people's peers run in one process (as two apps would on two
// devices), each under a swift-service-lifecycle ServiceGroup. Alice queues a text for Bob; Bob's app
// reacts to the delivery from the peer's event stream and reads its inbox. Then the apps talk directly
// over an app stream of their own protocol ("shout"), and shut down gracefully. No NIO type appears.
//
// Everything stays on loopback: 127.0.0.1 with a random SSDP port, so nothing reaches a real network.
import Foundation
import Logging
import ServiceLifecycle
import ThaliNodeCore

/// A person's node: a data directory with an identity and a store, and a peer pinned to loopback.
func makePeer(_ name: String, in directory: String, ssdpPort: Int) throws -> ThaliPeer {
    let home = NodeHome(path: directory + "/" + name)
    let identity = try NodeIdentity.create(in: home)
    let store = try NodeStore(home: home)
    var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
    configuration.ssdpPort = ssdpPort
    return try ThaliPeer(store: store, identity: identity, configuration: configuration)
}

let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-embedded-\(UUID().uuidString)").path
defer { try? FileManager.default.removeItem(atPath: directory) }
let ssdpPort = Int.random(in: 20000...60000)
let alice = try makePeer("alice", in: directory, ssdpPort: ssdpPort)
let bob = try makePeer("bob", in: directory, ssdpPort: ssdpPort)
try await alice.addContact(name: "bob", publicKey: bob.publicKey)
try await bob.addContact(name: "alice", publicKey: alice.publicKey)

// Subscribe before the peers start, so no event is missed.
let bobsEvents = bob.events()

// Bob's app serves its own protocol, "shout": it reads what the opener says to its end, then answers
// in capitals (the opener half-closed, and still reads the answer).
let shouts = try bob.handleStreams(protocol: "shout")
let shoutServer = Task {
    for await stream in shouts {
        try? await stream.withStream { inbound, outbound in
            var heard: [UInt8] = []
            for try await bytes in inbound { heard += bytes }
            try await outbound.write(String(decoding: heard, as: UTF8.self).uppercased())
        }
    }
}
let group = ServiceGroup(configuration: ServiceGroupConfiguration(
    services: [.init(service: alice), .init(service: bob)], logger: Logger(label: "example")))

let running = Task { try await group.run() }
let item = try await alice.send(text: "hello from an embedded peer", to: "bob")
print("alice's app queued \(item.id) for bob")
let received = try await withThrowingTaskGroup(of: String?.self) { tasks in
    tasks.addTask {
        // Bob's app: wait for the delivery, then read it from the inbox.
        for await event in bobsEvents {
            guard case .delivery(let contact, .received(let item)) = event else { continue }
            print("bob's app: \(contact) delivered item \(item.itemID)")
            return try await bob.inbox().first { $0.itemID == item.itemID }?.text
        }
        return nil
    }
    tasks.addTask {
        try await Task.sleep(for: .seconds(60))
        return nil
    }
    defer { tasks.cancelAll() }
    return try await tasks.next() ?? nil
}
guard let received else { fatalError("bob received nothing") }
print("bob's inbox: \"\(received)\"")

// Alice's app opens a stream to Bob for "shout" (it waits for a session with him), speaks, half-closes,
// and reads his answer to its end.
let stream = try await alice.openStream(to: "bob", protocol: "shout")
let answer = try await stream.withStream { inbound, outbound in
    try await outbound.write("hello over an app stream")
    outbound.finish()
    var answer: [UInt8] = []
    for try await bytes in inbound { answer += bytes }
    return String(decoding: answer, as: UTF8.self)
}
print("bob's app answered alice's stream: \"\(answer)\"")

await group.triggerGracefulShutdown()  // both peers say byebye and stop
try await running.value
await shoutServer.value  // bob's streams end with his peer
