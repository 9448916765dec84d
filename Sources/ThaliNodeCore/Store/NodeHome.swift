import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// The node's data directory: `--home DIR`, else `$THALI_HOME`, else `~/.thali`.
///
/// Layout: `config.json` (``NodeConfiguration``), `node.sqlite` (``NodeStore``, WAL mode),
/// `identity.key` (the node's private key, format owned by ThaliBeacons), `outbox/` (snapshots of queued
/// files), `inbox/<item id>/<name>` (received files), `partial/` (files being received), `run.lock`
/// (held by a running `thali-node run`, see ``RunLock``), `events.sock` (a running `run`'s events, see
/// ``NodeEventFeed``).
///
/// The directory is self-contained: the store records paths relative to it, so it can be moved or copied
/// whole. It is private: the directory and its subdirectories are 0700 and its files 0600, whatever
/// the umask or the parent's mode (``makePrivate()`` tightens an existing one).
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
    /// `run.lock`: locked (`flock`) by the `run` that uses the directory, with its pid inside.
    public var runLockPath: String { path + "/run.lock" }
    /// `events.sock`: the UNIX stream socket where a running `run` serves its events (``NodeEventFeed``).
    public var eventsSocketPath: String { path + "/events.sock" }
    /// `outbox/`: the node's own copies of queued files, so later changes to the originals cannot corrupt
    /// a delivery.
    public var outboxDirectory: String { path + "/outbox" }
    /// `inbox/`: received files, one directory per item.
    public var inboxDirectory: String { path + "/inbox" }
    /// `partial/`: files being received, kept across sessions for resuming.
    public var partialDirectory: String { path + "/partial" }

    /// The mode of the directory and its subdirectories.
    public static let directoryMode: mode_t = 0o700
    /// The mode of the files the node keeps in it.
    public static let fileMode: mode_t = 0o600

    /// Creates the directory and its subdirectories (mode 0700: the data is private).
    public func create() throws {
        try checkUsable(writing: true)
        for directory in [path, outboxDirectory, inboxDirectory, partialDirectory] {
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: Self.directoryMode])
            } catch {
                throw NodeError.dataDirectoryUnusable(path: directory, reason: SystemErrorText.describe(error))
            }
        }
    }

    /// `path` relative to the directory, if it lies inside it (what the store records); else unchanged.
    public func relative(_ path: String) -> String {
        path.hasPrefix(self.path + "/") ? String(path.dropFirst(self.path.count + 1)) : path
    }

    /// A path the store recorded, made absolute: relative ones are inside the directory.
    public func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : self.path + "/" + path
    }

    /// Throws a ``NodeError/dataDirectoryUnusable(path:reason:)`` that says what to do when the directory
    /// exists but cannot be used by this process: not a directory, or permissions that keep this user
    /// out (reading needs read and search permission; `writing`, write permission too). A directory that
    /// does not exist passes: commands that only read report it as empty, others create it.
    public func checkUsable(writing: Bool) throws {
        var info = stat()
        guard stat(path, &info) == 0 else {
            if errno == ENOENT { return }
            throw NodeError.dataDirectoryUnusable(path: path, reason: String(cString: strerror(errno)))
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw NodeError.dataDirectoryUnusable(path: path, reason: "it is not a directory; give a directory (or a new path) with --home")
        }
        guard access(path, writing ? (R_OK | W_OK | X_OK) : (R_OK | X_OK)) == 0 else {
            // Read first: looking the owner's name up (getpwuid) may change errno, and a read-only file
            // system was reported as a mode that chmod would fix.
            let failure = errno
            let mode = String(info.st_mode & 0o777, radix: 8)
            let owner = Self.userName(info.st_uid)
            let problem = if failure == EROFS {
                "it is on a read-only file system; remount it read-write, or give a --home on a writable one"
            } else if info.st_uid == geteuid() {
                // The node writes beside its database even to read it (SQLite's WAL).
                "permission denied (mode 0\(mode)): it must be readable and writable by you; `chmod 700 \(path)` fixes that"
            } else {
                "permission denied (owner \(owner), mode 0\(mode)); run as \(owner) or use a --home of your own"
            }
            throw NodeError.dataDirectoryUnusable(path: path, reason: problem)
        }
    }

    /// Whether a database file is missing its content while the directory holds received or queued files:
    /// then it was truncated or replaced, and starting afresh would silently forget them. Returns how many
    /// entries `inbox/` and `outbox/` hold when `node.sqlite` exists with 0 bytes, else nil.
    func orphanedEntriesBesideEmptyDatabase() -> Int? {
        var info = stat()
        guard stat(databasePath, &info) == 0, info.st_size == 0 else { return nil }
        let count = [inboxDirectory, outboxDirectory].reduce(0) {
            $0 + ((try? FileManager.default.contentsOfDirectory(atPath: $1))?.count ?? 0)
        }
        return count > 0 ? count : nil
    }

    /// Tightens the modes of an existing directory: itself and its subdirectories to 0700, its files to
    /// 0600 (the contents of `inbox/` and `outbox/` are private once their directory is). Returns a notice
    /// for each change a user should hear of (the directory and the database were readable by others);
    /// changes it is not allowed to make (another user's directory) are left alone.
    @discardableResult
    public func makePrivate() -> [String] {
        var notices: [String] = []
        func tighten(_ target: String, to mode: mode_t, announce: Bool) {
            var info = stat()
            guard lstat(target, &info) == 0, info.st_uid == geteuid(),
                  info.st_mode & S_IFMT == S_IFDIR || info.st_mode & S_IFMT == S_IFREG else { return }
            let current = info.st_mode & 0o777
            guard current & ~mode != 0, chmod(target, current & mode) == 0 else { return }
            if announce {
                notices.append("\(target) was readable by others (mode 0\(String(current, radix: 8))); made it 0\(String(current & mode, radix: 8))")
            }
        }
        tighten(path, to: Self.directoryMode, announce: true)
        for directory in [outboxDirectory, inboxDirectory, partialDirectory] {
            tighten(directory, to: Self.directoryMode, announce: false)
        }
        tighten(databasePath, to: Self.fileMode, announce: true)
        for file in [databasePath + "-wal", databasePath + "-shm", configurationPath, runLockPath] {
            tighten(file, to: Self.fileMode, announce: false)
        }
        return notices
    }

    /// The name of user `uid`, or the number.
    static func userName(_ uid: uid_t) -> String {
        guard let entry = getpwuid(uid), let name = entry.pointee.pw_name else { return "uid \(uid)" }
        return String(cString: name)
    }
}

/// The lock a `thali-node run` holds on its data directory: an exclusive `flock` on `run.lock`, released
/// by the kernel when the process ends however it ends (a killed run leaves no stale lock). The file holds
/// the holder's pid, for the message a second run gets.
public final class RunLock: Sendable {
    private let descriptor: Int32

    /// Takes the lock of `home` (which must exist), or throws ``NodeError/homeInUse(path:pid:)`` naming the
    /// process that holds it.
    public init(home: NodeHome) throws {
        let path = home.runLockPath
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, NodeHome.fileMode)
        guard descriptor >= 0 else {
            throw NodeError.dataDirectoryUnusable(path: path, reason: String(cString: strerror(errno)))
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let busy = errno == EWOULDBLOCK
            let reason = String(cString: strerror(errno))
            close(descriptor)
            if busy { throw NodeError.homeInUse(path: home.path, pid: RunLock.holder(of: home)) }
            throw NodeError.dataDirectoryUnusable(path: path, reason: reason)
        }
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(descriptor, 0)
        _ = pid.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) }
        self.descriptor = descriptor
    }

    deinit { close(descriptor) }

    /// The pid of the `run` holding `home`'s lock (0 if its pid cannot be read), nil if none does;
    /// creates nothing.
    public static func holder(of home: NodeHome) -> Int32? {
        let descriptor = open(home.runLockPath, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        // A shared lock is refused only while a run holds the exclusive one.
        if flock(descriptor, LOCK_SH | LOCK_NB) == 0 {
            flock(descriptor, LOCK_UN)
            return nil
        }
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = buffer.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
        let text = String(decoding: buffer.prefix(max(0, count)), as: UTF8.self)
        return Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
    }
}
