import Foundation

/// The node's data directory: `--home DIR`, else `$THALI_HOME`, else `~/.thali`.
///
/// Layout: `config.json` (``NodeConfiguration``), `node.sqlite` (``NodeStore``, WAL mode),
/// `identity.key` (the node's private key, format owned by ThaliBeacons), `outbox/` (snapshots of queued
/// files), `inbox/<item id>/<name>` (received files), `partial/` (files being received).
public struct NodeHome: Sendable, Hashable {
    /// The directory's absolute path.
    public let path: String

    /// Uses `path` as the data directory.
    public init(path: String) {
        self.path = URL(fileURLWithPath: path).standardizedFileURL.path
    }

    /// Resolves the data directory: `explicit` (the `--home` option) if given, else `THALI_HOME` from
    /// `environment`, else `.thali` in the user's home directory.
    public static func resolve(explicit: String? = nil,
                               environment: [String: String] = ProcessInfo.processInfo.environment) -> NodeHome {
        if let explicit, !explicit.isEmpty { return NodeHome(path: explicit) }
        if let fromEnvironment = environment["THALI_HOME"], !fromEnvironment.isEmpty { return NodeHome(path: fromEnvironment) }
        let userHome = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? FileManager.default.homeDirectoryForCurrentUser.path
        return NodeHome(path: userHome + "/.thali")
    }

    /// `config.json`.
    public var configurationPath: String { path + "/config.json" }
    /// `node.sqlite`.
    public var databasePath: String { path + "/node.sqlite" }
    /// `identity.key`.
    public var identityPath: String { path + "/identity.key" }
    /// `outbox/`: the node's own copies of queued files, so later changes to the originals cannot corrupt
    /// a delivery.
    public var outboxDirectory: String { path + "/outbox" }
    /// `inbox/`: received files, one directory per item.
    public var inboxDirectory: String { path + "/inbox" }
    /// `partial/`: files being received, kept across sessions for resuming.
    public var partialDirectory: String { path + "/partial" }

    /// Creates the directory and its subdirectories (mode 0700: the data is private).
    public func create() throws {
        for directory in [path, outboxDirectory, inboxDirectory, partialDirectory] {
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            } catch {
                throw NodeError.dataDirectoryUnusable(path: directory, reason: error.localizedDescription)
            }
        }
    }
}
