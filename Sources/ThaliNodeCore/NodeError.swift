import Foundation
import GRDB
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
    /// The public key is already another contact's (`holder`).
    case contactKeyExists(holder: String)
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
    /// A running peer (a `thali-node run` or an app's ``ThaliPeer``, process `pid` if known: nil or 0
    /// otherwise) holds the data directory's lock.
    case homeInUse(path: String, pid: Int32?)
    /// Removing the contact would delete items still queued for it; it needs `--force`.
    case contactHasQueuedItems(String, count: Int, bytes: Int64)
    /// No item with that id (or id prefix) in the outbox or inbox (`box`: "outbox" or "inbox").
    case unknownItem(String, box: String)
    /// More than one item's id starts with that prefix.
    case ambiguousItem(String, box: String, candidates: [String])
    /// The file changed while it was copied into the outbox (`what`: its size, time or content): the copy
    /// could hold content that never existed, so it was not queued.
    case fileChangedWhileRead(path: String, what: String)

    public var description: String {
        switch self {
        case .missingIdentity(let path):
            "no identity at \(path); create one with `thali-node identity create\(Self.homeOption(forFileAt: path))`"
        case .unusableIdentity(let path, let reason): "cannot use the identity at \(path): \(reason)"
        case .identityExists(let path): "an identity exists already at \(path); replacing it needs --force (contacts will have to re-add the new key)"
        case .unknownContact(let name): "unknown contact \"\(name)\"; see `thali-node contacts list`"
        case .contactExists(let name): "a contact named \"\(name)\" exists already"
        case .contactKeyExists(let holder):
            "this public key is already contact \"\(holder)\"'s; see `thali-node contacts list` (one key, one contact)"
        case .invalidContactName(let name, let reason): "invalid contact name \"\(name)\": \(reason)"
        case .invalidPublicKey(let key, let reason): "invalid public key \"\(key)\": \(reason)"
        case .portInUse(let host, let port): "port \(port) on \(host) is in use (by another program, or by another listener of this one)"
        case .bluetoothUnavailable(let reason): "Bluetooth cannot run: \(reason)"
        case .addressNotLocal(let address, let reason): "address \"\(address)\" cannot be used: \(reason)"
        case .noUsableInterface(let name):
            name.map { "network interface \"\($0)\" is missing, down or has no IPv4 address" }
                ?? "no usable network interface (up, with an IPv4 address)"
        case .dataDirectoryUnusable(let path, let reason): "cannot use data directory \(path): \(reason)"
        case .storeUnavailable(let path, let reason): "cannot open the database \(path): \(reason)"
        case .unreadableFile(let path, let reason): "cannot read \(path): \(reason)"
        case .itemTooLarge(let size, let limit):
            "the item is \(ByteCount.exact(size)), over this node's limit of \(ByteCount.exact(limit)) (maxItemBytes, or maxTextBytes for a text, in config.json)"
        case .invalidFileName(let name):
            "file name \"\(name)\" cannot be delivered (it must be one path component, no longer than maxNameBytes, without control or "
                + "direction-changing characters); give another with --name"
        case .invalidExpiry(let value): "invalid expiry \(value): it must be in the future"
        case .sessionInProgress(let contact, let role): "a \(role) session with \(contact) is already running"
        case .homeInUse(let path, let pid):
            "\(path) is in use by another running peer (a `thali-node run` or an app)\(pid.flatMap { $0 > 0 ? " (pid \($0))" : nil } ?? ""); "
                + "stop it first, or use another data directory"
        case .contactHasQueuedItems(let name, let count, let bytes):
            "contact \"\(name)\" has \(count) queued item\(count == 1 ? "" : "s") (\(ByteCount.format(bytes))) that removing it would delete; "
                + "use --force to delete them, or wait until they are delivered"
        case .unknownItem(let id, let box):
            "no item \"\(id)\" in the \(box)\(id.count < NodeStore.minimumIDPrefixLength ? " (give at least \(NodeStore.minimumIDPrefixLength) digits of its id)" : ""); see `thali-node \(box)`"
        case .ambiguousItem(let id, let box, let candidates):
            "\"\(id)\" names \(candidates.count) items in the \(box) (\(candidates.prefix(4).joined(separator: ", "))\(candidates.count > 4 ? ", …" : "")); give more of the id"
        case .fileChangedWhileRead(let path, let what):
            "\(path) changed while it was read (\(what)); nothing was queued: send it again once it is no longer being written"
        }
    }

    /// ` --home DIR` for the hint of a command about the file at `path`, unless its directory is the
    /// default one (the user typed no --home).
    static func homeOption(forFileAt path: String) -> String {
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().standardizedFileURL.path
        guard directory != NodeHome.resolve().path else { return "" }
        return " --home " + ShellQuoting.quote(directory)
    }

    /// Maps a bind failure to ``portInUse(host:port:)`` when the address is taken; other errors unchanged.
    public static func mapBindError(_ error: any Error, host: String, port: Int) -> any Error {
        if let ioError = error as? IOError, ioError.errnoCode == EADDRINUSE {
            return NodeError.portInUse(host: host, port: port)
        }
        return error
    }
}

/// Quoting for paths shown in commands to copy.
enum ShellQuoting {
    /// `text` as one shell word: unchanged if it has only safe characters, else in single quotes.
    static func quote(_ text: String) -> String {
        let safe = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@%+=,")
        if !text.isEmpty && text.unicodeScalars.allSatisfy({ safe.contains($0) }) { return text }
        return "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'"
    }
}

/// Byte counts for people.
public enum ByteCount {
    /// `bytes` in the same words as the `Int64` form.
    public static func format(_ bytes: UInt64) -> String { format(Int64(clamping: bytes)) }

    /// `bytes` exactly, with the short form beside it from 1 KiB on: `11 bytes`, `3.0 GiB (3221225472 bytes)`.
    public static func exact(_ bytes: UInt64) -> String {
        bytes < 1024 ? format(Int64(clamping: bytes)) : "\(format(Int64(clamping: bytes))) (\(bytes) bytes)"
    }

    /// `bytes` for people, in binary units as `ls -h` and `df -h` count: `19 bytes`, `1.0 KiB`,
    /// `50.0 MiB`, `1.5 GiB` (one decimal from 1 KiB on). The one size formatter of the node's words.
    public static func format(_ bytes: Int64) -> String {
        let bytes = UInt64(max(0, bytes))
        if bytes == 1 { return "1 byte" }
        if bytes < 1024 { return "\(bytes) bytes" }
        var value = Double(bytes) / 1024
        for unit in ["KiB", "MiB", "GiB", "TiB"] {
            if value < 1024 || unit == "TiB" { return String(format: "%.1f %@", value, unit) }
            value /= 1024
        }
        return "\(bytes) bytes"
    }
}

/// Words for the Foundation, SQLite, NIO and system errors a user can meet, with what to do, instead of
/// their debug descriptions (`Error Domain=NSCocoaErrorDomain Code=640 …`, `SQLite error 14`).
public enum SystemErrorText {
    /// What `error` means to a user.
    public static func describe(_ error: any Error) -> String {
        switch error {
        case let error as NodeError: return error.description
        case let error as DatabaseError: return describe(database: error)
        case let error as IOError: return describe(errno: error.errnoCode)
        case is CancellationError: return "cancelled"
        default: break
        }
        let nsError = error as NSError
        if nsError.domain == NSPOSIXErrorDomain { return describe(errno: Int32(nsError.code)) }
        if let underlying = nsError.userInfo[NSUnderlyingErrorKey] as? NSError, underlying.domain == NSPOSIXErrorDomain {
            return describe(errno: Int32(underlying.code))
        }
        if nsError.domain == NSCocoaErrorDomain {
            switch CocoaError.Code(rawValue: nsError.code) {
            case .fileWriteOutOfSpace: return describe(errno: ENOSPC)
            case .fileWriteVolumeReadOnly: return describe(errno: EROFS)
            case .fileWriteNoPermission, .fileReadNoPermission: return describe(errno: EACCES)
            case .fileNoSuchFile, .fileReadNoSuchFile: return describe(errno: ENOENT)
            case .fileWriteFileExists: return describe(errno: EEXIST)
            default: break
            }
        }
        return "\(error)"
    }

    /// What a system error number means, with what to do for the common ones.
    public static func describe(errno code: Int32) -> String {
        switch code {
        case ENOSPC, EDQUOT: "the disk is full; free some space and try again"
        case EROFS: "the file system is read-only"
        case EACCES, EPERM: "permission denied; check the owner and mode of the file and its directory"
        case ENOENT: "no such file or directory"
        default: String(cString: strerror(code))
        }
    }

    /// What an SQLite failure means for the node's database, and what to do.
    static func describe(database error: DatabaseError) -> String {
        switch error.resultCode {
        case .SQLITE_FULL: describe(errno: ENOSPC)
        case .SQLITE_CORRUPT, .SQLITE_NOTADB:
            "the database is damaged (\(error.message ?? "malformed")); move node.sqlite aside and restore it from a backup "
                + "(received files stay in inbox/), or move the whole directory aside to start afresh"
        case .SQLITE_CANTOPEN, .SQLITE_PERM, .SQLITE_AUTH:
            "it cannot be opened: check that you own the data directory and may write to it (SQLite needs to, even to read)"
        case .SQLITE_READONLY: "it is read-only; the data directory and node.sqlite must be writable"
        case .SQLITE_BUSY, .SQLITE_LOCKED: "another process holds it locked; try again once it has finished"
        case .SQLITE_IOERR: "input/output error reading or writing it (failing disk or a full file system?)"
        default: error.message ?? "\(error)"
        }
    }
}

extension NodeError: LocalizedError {
    /// The same words as ``description``, so that `localizedDescription` shows them in an app (it was
    /// "The operation could not be completed. (ThaliNodeCore.NodeError error 0.)").
    public var errorDescription: String? { description }
}
