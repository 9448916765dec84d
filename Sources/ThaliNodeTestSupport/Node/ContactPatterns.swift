import ThaliNodeCore

/// A contact's name matches its identity in a pattern, so that a test reads
/// `case .connected("bob", .accepting, _, _)` of an event whose contact is a ``ContactIdentity``. The name
/// is unique in an address book; a test that cares about the key compares the identity itself.
public func ~= (name: String, contact: ContactIdentity) -> Bool { contact.name == name }

extension ContactIdentity {
    /// An identity named `name` for tests of events and their records, with a fixed key of the stored form
    /// (a compressed point's 33 bytes in hex, here the name's bytes after zeros: not a point on the curve).
    public static func sample(_ name: String) -> ContactIdentity {
        let hex = name.utf8.prefix(32).map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
        return ContactIdentity(name: name, publicKey: "02" + String(repeating: "0", count: 64 - hex.count) + hex)
    }
}
