import NIOConcurrencyHelpers

/// Live OpenSSL wrapper objects, by kind: every wrapper counts itself in `init` and out in `deinit`, so
/// tests can prove that every path (failed handshakes included) frees what it allocated.
public enum PSKTLSDiagnostics {
    /// The number of live wrappers of each kind: `SSL_CTX`, `SSL` (with its BIO) and the
    /// DH group `EVP_PKEY`.
    public struct LiveObjects: Hashable, Sendable, CustomStringConvertible {
        /// Live `PSKTLSContext`s (`SSL_CTX`).
        public var contexts = 0
        /// Live connections (`SSL` with its BIO).
        public var connections = 0
        /// Live DH group keys (`EVP_PKEY`).
        public var dhParameters = 0

        /// The counts on one line.
        public var description: String {
            "contexts=\(contexts) connections=\(connections) dhParameters=\(dhParameters)"
        }
    }

    private static let counts = NIOLockedValueBox(LiveObjects())

    /// A snapshot of the live wrapper counts.
    public static var liveObjects: LiveObjects { counts.withLockedValue { $0 } }

    static func adjust(_ keyPath: WritableKeyPath<LiveObjects, Int>, by delta: Int) {
        counts.withLockedValue { $0[keyPath: keyPath] += delta }
    }
}
