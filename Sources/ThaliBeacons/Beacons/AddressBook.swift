import ThaliSupport

/// Why a contact could not be added to an address book.
public struct AddressBookError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What went wrong.
    public var detail: String

    /// Creates an error.
    public init(_ detail: String) { self.detail = detail }

    public var description: String { detail }
}

/// The contacts a receiver recognises as senders, keyed by their KeyId in the receiver's profile,
/// with each contact's ECDH secret with our identity (Sxy) cached on first use. Thread-safe and
/// bounded by `BeaconLimits.addressBookCapacity`. Created by, and tied to, one `BeaconReceiver`.
public final class AddressBook: Sendable {
    struct Entry {
        let key: PublicKey
        var sharedSecret: [UInt8]?
    }

    /// Most contacts this book holds.
    public let capacity: Int
    private let profile: BeaconProfile
    private let entries: Locked<[KeyId: Entry]>

    init(profile: BeaconProfile, capacity: Int) {
        self.profile = profile
        self.capacity = capacity
        self.entries = Locked([:])
    }

    /// Adds a contact (adding one already present changes nothing). Throws when the book is full.
    public func add(_ contact: PublicKey) throws(AddressBookError) {
        let id = KeyId(of: contact, profile: profile)
        let capacity = capacity
        let added = entries.withLock { entries in
            if entries[id] != nil { return true }
            guard entries.count < capacity else { return false }
            entries[id] = Entry(key: contact, sharedSecret: nil)
            return true
        }
        guard added else { throw AddressBookError("the address book is full (\(capacity) contacts)") }
    }

    /// Adds every contact, stopping with an error at the first that does not fit.
    public func add(contentsOf contacts: some Sequence<PublicKey>) throws(AddressBookError) {
        for contact in contacts { try add(contact) }
    }

    /// Removes a contact; returns whether it was present.
    @discardableResult
    public func remove(_ contact: PublicKey) -> Bool {
        let id = KeyId(of: contact, profile: profile)
        return entries.withLock { $0.removeValue(forKey: id) != nil }
    }

    /// Whether `contact` is in the book.
    public func contains(_ contact: PublicKey) -> Bool {
        let id = KeyId(of: contact, profile: profile)
        return entries.withLock { $0[id] != nil }
    }

    /// Number of contacts.
    public var count: Int { entries.withLock { $0.count } }

    /// Number of contacts whose Sxy is cached.
    public var cachedSecretCount: Int { entries.withLock { $0.values.reduce(0) { $0 + ($1.sharedSecret == nil ? 0 : 1) } } }

    /// The contacts, in no particular order.
    public var contacts: [PublicKey] { entries.withLock { $0.values.map(\.key) } }

    func entry(for id: KeyId) -> Entry? { entries.withLock { $0[id] } }

    func cache(sharedSecret: [UInt8], for id: KeyId) {
        entries.withLock { $0[id]?.sharedSecret = sharedSecret }
    }
}
