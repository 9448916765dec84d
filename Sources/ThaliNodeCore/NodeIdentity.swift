import Foundation
import ThaliBeacons

/// The node's own identity: a secp256k1 private key in `identity.key` of the data directory (the PEM
/// format of ThaliBeacons' `IdentityKeyFile`, mode 0600).
public enum NodeIdentity {
    /// Creates a new identity in `home`. Refuses to replace an existing one unless `replace` is set
    /// (a new key means every contact has to learn it again).
    @discardableResult
    public static func create(in home: NodeHome, replace: Bool = false) throws -> PrivateKey {
        try home.create()
        let path = home.identityPath
        if !replace && FileManager.default.fileExists(atPath: path) { throw NodeError.identityExists(path: path) }
        let key = PrivateKey()
        do {
            try IdentityKeyFile.save(key, to: path)
        } catch {
            throw NodeError.unusableIdentity(path: path, reason: error.description)
        }
        return key
    }

    /// Loads the identity of `home`: ``NodeError/missingIdentity(path:)`` if there is none,
    /// ``NodeError/unusableIdentity(path:reason:)`` if the file cannot be used (format, permissions).
    public static func load(from home: NodeHome) throws -> PrivateKey {
        let path = home.identityPath
        guard FileManager.default.fileExists(atPath: path) else { throw NodeError.missingIdentity(path: path) }
        do {
            return try IdentityKeyFile.load(from: path)
        } catch {
            throw NodeError.unusableIdentity(path: path, reason: error.description)
        }
    }
}
