import Foundation
import NIOCore

/// Errors of the node a user can act on, each with the context needed to fix it.
public enum NodeError: Error, Hashable, CustomStringConvertible {
    /// No identity in the data directory (`thali-node identity create` makes one).
    case missingIdentity(path: String)
    /// The identity file exists but cannot be used (bad format, permissions open to others).
    case unusableIdentity(path: String, reason: String)
    /// `identity create` would replace an existing identity.
    case identityExists(path: String)
    /// No contact of that name.
    case unknownContact(String)
    /// A contact of that name exists already.
    case contactExists(String)
    /// A contact name that is empty, too long, or has control characters.
    case invalidContactName(String, reason: String)
    /// A public key that cannot be a contact's key.
    case invalidPublicKey(String, reason: String)
    /// The port is taken by another process.
    case portInUse(host: String, port: Int)
    /// No network interface to use (`name` is the configured one, if any).
    case noUsableInterface(name: String?)
    /// The address to pin to is not an IPv4 address, or no local interface has it.
    case addressNotLocal(String, reason: String)
    /// The data directory (or one of its subdirectories) cannot be created or used.
    case dataDirectoryUnusable(path: String, reason: String)
    /// The database cannot be opened or migrated.
    case storeUnavailable(path: String, reason: String)
    /// A file to send cannot be read.
    case unreadableFile(path: String, reason: String)
    /// An item is larger than the configured limit.
    case itemTooLarge(size: UInt64, limit: UInt64)
    /// A file name that cannot be delivered (see ``FileNames/isSafe(_:)``).
    case invalidFileName(String)
    /// An expiry that is not in the future.
    case invalidExpiry(String)
    /// A delivery session of this direction with this contact is already running.
    case sessionInProgress(contact: String, role: String)
    /// Bluetooth was asked for (alone) and cannot run: no adapter, bluetoothd absent, no kernel support.
    case bluetoothUnavailable(reason: String)

    public var description: String {
        switch self {
        case .missingIdentity(let path): "no identity at \(path); create one with `thali-node identity create`"
        case .unusableIdentity(let path, let reason): "cannot use the identity at \(path): \(reason)"
        case .identityExists(let path): "an identity exists already at \(path); replacing it needs --force (contacts will have to re-add the new key)"
        case .unknownContact(let name): "unknown contact \"\(name)\"; see `thali-node contacts list`"
        case .contactExists(let name): "a contact named \"\(name)\" exists already"
        case .invalidContactName(let name, let reason): "invalid contact name \"\(name)\": \(reason)"
        case .invalidPublicKey(let key, let reason): "invalid public key \"\(key)\": \(reason)"
        case .portInUse(let host, let port): "port \(port) on \(host) is in use by another process"
        case .bluetoothUnavailable(let reason): "Bluetooth cannot run: \(reason)"
        case .addressNotLocal(let address, let reason): "address \"\(address)\" cannot be used: \(reason)"
        case .noUsableInterface(let name):
            name.map { "network interface \"\($0)\" is missing, down or has no IPv4 address" }
                ?? "no usable network interface (up, with an IPv4 address)"
        case .dataDirectoryUnusable(let path, let reason): "cannot use data directory \(path): \(reason)"
        case .storeUnavailable(let path, let reason): "cannot open the database \(path): \(reason)"
        case .unreadableFile(let path, let reason): "cannot read \(path): \(reason)"
        case .itemTooLarge(let size, let limit): "item of \(size) bytes exceeds the limit of \(limit) bytes"
        case .invalidFileName(let name): "file name \"\(name)\" cannot be delivered"
        case .invalidExpiry(let value): "invalid expiry \(value): it must be in the future"
        case .sessionInProgress(let contact, let role): "a \(role) session with \(contact) is already running"
        }
    }

    /// Maps a bind failure to ``portInUse(host:port:)`` when the address is taken; other errors unchanged.
    public static func mapBindError(_ error: any Error, host: String, port: Int) -> any Error {
        if let ioError = error as? IOError, ioError.errnoCode == EADDRINUSE {
            return NodeError.portInUse(host: host, port: port)
        }
        return error
    }
}
