import Foundation
import ThaliBeacons

/// The node's own identity: a secp256k1 private key in `identity.key` of the data directory (the PEM
/// format of ThaliBeacons' `IdentityKeyFile`, mode 0600).
public enum NodeIdentity {
    /// Creates a new identity in `home`. Refuses to replace an existing one unless `replace` is set
    /// (a new key means every contact has to learn it again); the replaced key is kept (see
    /// ``replace(in:now:)``).
    @discardableResult
    public static func create(in home: NodeHome, replace: Bool = false) throws -> PrivateKey {
        try create(in: home, replacing: replace).key
    }

    /// Creates a new identity in `home`, keeping the one it replaces beside it as
    /// `identity.key.replaced-<UTC time>` (`-2`, `-3`, … for more within a second; mode 0600), as nothing
    /// else could bring it back. Returns the
    /// new key and where the old one was kept (nil if there was none).
    public static func replace(in home: NodeHome, now: Date = Date()) throws -> (key: PrivateKey, oldKeyKeptAt: String?) {
        try create(in: home, replacing: true, now: now)
    }

    private static func create(in home: NodeHome, replacing: Bool, now: Date = Date()) throws -> (key: PrivateKey, oldKeyKeptAt: String?) {
        try home.create()
        let path = home.identityPath
        var kept: String?
        if FileManager.default.fileExists(atPath: path) {
            guard replacing else { throw NodeError.identityExists(path: path) }
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withYear, .withMonth, .withDay, .withTime, .withTimeZone]
            let stamp = path + ".replaced-" + formatter.string(from: now)
            // link, not rename: the old key stays in place until the new one replaces it atomically. A
            // second replacement within the same second gets a numbered name.
            var backup = stamp
            var attempt = 1
            var failure: Int32 = link(path, backup) == 0 ? 0 : errno
            while failure == EEXIST && attempt < 100 {
                attempt += 1
                backup = stamp + "-\(attempt)"
                failure = link(path, backup) == 0 ? 0 : errno
            }
            guard failure == 0 else {
                throw NodeError.unusableIdentity(path: path, reason: "cannot keep a copy at \(backup): "
                                                 + SystemErrorText.describe(errno: failure))
            }
            kept = backup
        }
        let key = PrivateKey()
        do {
            try IdentityKeyFile.save(key, to: path)
        } catch {
            throw NodeError.unusableIdentity(path: path, reason: error.description)
        }
        return (key, kept)
    }

    /// Loads the identity of `home`: ``NodeError/missingIdentity(path:)`` if there is none,
    /// ``NodeError/unusableIdentity(path:reason:)`` if the file cannot be used (format, permissions), and
    /// ``NodeError/dataDirectoryUnusable(path:reason:)`` if the directory cannot be read (never "missing").
    public static func load(from home: NodeHome) throws -> PrivateKey {
        try home.checkUsable(writing: false)
        let path = home.identityPath
        guard FileManager.default.fileExists(atPath: path) else { throw NodeError.missingIdentity(path: path) }
        do {
            return try IdentityKeyFile.load(from: path)
        } catch {
            throw NodeError.unusableIdentity(path: path, reason: error.description)
        }
    }
}
