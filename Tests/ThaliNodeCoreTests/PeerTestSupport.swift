import Foundation
import Testing
import ThaliBeacons
@testable import ThaliNodeCore

/// People for peer tests: each a data directory with an identity, all of them each other's contacts.
final class TestPeople: @unchecked Sendable {
    struct Person {
        let name: String
        let temporary: TemporaryHome
        let key: PrivateKey
        let store: NodeStore
        var home: NodeHome { temporary.home }
        var publicKey: String { key.publicKey.hexString(compressed: true) }
    }

    let people: [Person]

    init(_ names: [String], label: String) throws {
        people = try names.map { name in
            let temporary = TemporaryHome("\(label)-\(name)")
            try temporary.home.create()
            let key = try NodeIdentity.create(in: temporary.home)
            return Person(name: name, temporary: temporary, key: key, store: try NodeStore(home: temporary.home))
        }
        for person in people {
            for other in people where other.name != person.name {
                try person.store.addContact(name: other.name, publicKey: other.publicKey)
            }
        }
    }

    /// The person called `name`; the test fails if there is none.
    subscript(_ name: String) -> Person {
        get throws {
            let person = people.first { $0.name == name }
            return try #require(person, "no test person named \(name)")
        }
    }

    /// What each inbox holds, as (sender name, item id) pairs, in arrival order.
    func inbox(of name: String) throws -> [(from: String, id: UUID)] {
        let byKey = Dictionary(uniqueKeysWithValues: people.map { ($0.publicKey, $0.name) })
        return try self[name].store.inbox().map { (byKey[$0.fromPublicKey] ?? "?", $0.itemID) }
    }
}

/// A random port for SSDP multicast, so concurrent runs do not hear each other.
func randomSSDPPort() -> Int { Int.random(in: 20000...60000) }

/// A quiet `ThaliPeer` for `person`, pinned to 127.0.0.1 with `ssdpPort`; `configure` adjusts the rest.
func loopbackPeer(_ person: TestPeople.Person, ssdpPort: Int,
                  _ configure: (inout PeerConfiguration) -> Void = { _ in }) throws -> ThaliPeer {
    var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
    configuration.ssdpPort = ssdpPort
    configure(&configuration)
    return try ThaliPeer(store: person.store, identity: person.key, configuration: configuration, logger: quietLogger)
}

/// The `thali-node` built beside this test bundle.
var thaliNodeExecutable: String { CommandLineTests.executable }
