/// A contact as events name it: the name the user gave it and its public key, so that an app can tell
/// contacts apart by key (a name can be reused after a contact is removed) without asking the store.
public struct ContactIdentity: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The contact's unique name in the address book (``Contact/name``).
    public var name: String
    /// The contact's public key, normalised (``Contact/publicKey``): 33 bytes in lower-case hex.
    public var publicKey: String

    /// The identity `name` with `publicKey`.
    public init(name: String, publicKey: String) {
        self.name = name
        self.publicKey = publicKey
    }

    /// The identity of a stored contact.
    public init(_ contact: Contact) {
        self.init(name: contact.name, publicKey: contact.publicKey)
    }

    /// The name: what a person reads in a log line.
    public var description: String { name }
}

extension Contact {
    /// The contact as events name it.
    public var identity: ContactIdentity { ContactIdentity(self) }
}
