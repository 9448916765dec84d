/// Why a key could not be imported, loaded or saved.
public struct KeyError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kind of failure.
    public enum Kind: String, Hashable, Sendable {
        /// The bytes are not a SEC1 point of 33 (compressed) or 65 (uncompressed) bytes.
        case invalidEncoding = "invalid-encoding"
        /// The encoding is well formed but the point is not on secp256k1.
        case notOnCurve = "not-on-curve"
        /// A private key is not 32 bytes or not in 1 ..< n.
        case invalidPrivateKey = "invalid-private-key"
        /// A key file is not in the documented format.
        case invalidKeyFile = "invalid-key-file"
        /// A private key file can be read by group or others.
        case insecurePermissions = "insecure-permissions"
        /// The operating system refused to read or write a key file.
        case fileSystem = "file-system"
    }

    /// The kind of failure.
    public var kind: Kind
    /// What exactly was wrong, for logs and error messages.
    public var detail: String

    /// Creates an error of `kind` with a human-readable `detail`.
    public init(_ kind: Kind, _ detail: String) {
        self.kind = kind
        self.detail = detail
    }

    public var description: String { "\(kind.rawValue): \(detail)" }
}
