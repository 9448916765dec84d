import Foundation
import Logging
import ThaliBeacons
import ThaliNodeCore

/// A fresh data directory under the system's temporary directory, removed when the value is released.
public final class TemporaryHome: @unchecked Sendable {
    /// The directory (not created: `home.create()` or a `thali-node` command does that).
    public let home: NodeHome

    /// A directory whose name carries `label`, this process's id and a random part.
    public init(_ label: String = "node") {
        let path = FileManager.default.temporaryDirectory
            .appendingPathComponent("thali-node-test-\(label)-\(getpid())-\(UUID().uuidString.prefix(8))").path
        home = NodeHome(path: path)
    }

    deinit { try? FileManager.default.removeItem(atPath: home.path) }
}

/// The compressed hex public key of a fresh identity, for contacts in tests.
public func randomPublicKey() -> String {
    PrivateKey().publicKey.hexString(compressed: true)
}

/// Random bytes (seeded generator not needed: tests compare digests, not values).
public func randomBytes(_ count: Int) -> [UInt8] {
    var generator = SystemRandomNumberGenerator()
    return (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
}

/// Sessions in tests log nothing (hundreds of sessions run); the events carry what the tests check.
public let quietLogger = Logger(label: "thali.test") { _ in SwiftLogNoOpLogHandler() }
