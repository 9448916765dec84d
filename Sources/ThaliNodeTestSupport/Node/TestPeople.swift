import Foundation
import Testing
import ThaliBeacons
import ThaliNodeCore

/// People for peer tests: each a data directory with an identity, all of them each other's contacts.
public final class TestPeople: @unchecked Sendable {
    /// One person: a data directory, its identity and its open store.
    public struct Person: Sendable {
        public let name: String
        public let temporary: TemporaryHome
        public let key: PrivateKey
        public let store: NodeStore
        public var home: NodeHome { temporary.home }
        public var publicKey: String { key.publicKey.hexString(compressed: true) }
    }

    public let people: [Person]

    /// A person for each of `names`, their directories named with `label`.
    public init(_ names: [String], label: String) throws {
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
    public subscript(_ name: String) -> Person {
        get throws {
            let person = people.first { $0.name == name }
            return try #require(person, "no test person named \(name)")
        }
    }

    /// What each inbox holds, as (sender name, item id) pairs, in arrival order.
    public func inbox(of name: String) throws -> [(from: String, id: UUID)] {
        let byKey = Dictionary(uniqueKeysWithValues: people.map { ($0.publicKey, $0.name) })
        return try self[name].store.inbox().map { (byKey[$0.fromPublicKey] ?? "?", $0.itemID) }
    }
}

/// A random port for SSDP multicast, so concurrent runs do not hear each other.
public func randomSSDPPort() -> Int { Int.random(in: 20000...60000) }
