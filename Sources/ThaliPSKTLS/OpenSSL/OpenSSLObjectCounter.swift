import NIOConcurrencyHelpers

/// Live OpenSSL wrapper objects, by kind: every wrapper counts itself in `init` and out in `deinit`, so
/// tests can prove that every path (failed handshakes included) frees what it allocated.
public enum PSKTLSDiagnostics {
    /// The number of live wrappers of each kind: `SSL_CTX`, `SSL` (with its two memory BIOs) and the
    /// DH group `EVP_PKEY`.
    public struct LiveObjects: Hashable, Sendable, CustomStringConvertible {
        public var contexts = 0
        public var connections = 0
        public var dhParameters = 0

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
