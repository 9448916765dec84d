import Foundation
import ThaliBeacons
#if canImport(Glibc)
import Glibc
#endif

/// How the suite drives the implementation under test (spec/conformance.md, "Adapter contract"): a
/// command (an argv prefix) that accepts four verbs, which `thali-node --home DIR` meets as it is:
///
/// - `contacts add NAME PUBLIC-KEY`: add a contact (exit 0);
/// - `send NAME TEXT --json`: queue a text for a contact; prints a JSON object with `id` (a UUID);
/// - `inbox --json`: prints a JSON array of received items, each with `id`, `from_public_key` (or
///   `fromPublicKey`), `kind`, `text`;
/// - `events`: runs until stopped, printing the implementation's events as JSON lines
///   (``AdapterEventFollower`` reads them).
public struct ConformanceAdapter: Sendable {
    /// The command, e.g. `["thali-node", "--home", "/tmp/iut"]`.
    public var command: [String]
    /// Longest a verb may run.
    public var timeout: Duration
    /// Largest output read from a verb (an inbox listing); beyond it the verb counts as failed.
    public static let maximumOutputBytes = 8 << 20

    /// An adapter running `command`.
    public init(command: [String], timeout: Duration = .seconds(20)) {
        self.command = command
        self.timeout = timeout
    }

    /// A verb that failed: exit status, timeout, or output that breaks the contract.
    public struct Failure: Error, CustomStringConvertible {
        /// What went wrong, with the command line.
        public let description: String
    }

    /// An item in the implementation's inbox.
    public struct InboxItem: Sendable, Hashable, Decodable {
        /// The item's id.
        public var id: String
        /// The sender's public key (any encoding `PublicKey` parses).
        public var fromPublicKey: String
        /// `text` or `file`.
        public var kind: String
        /// The text, for a text item.
        public var text: String?

        private enum CodingKeys: String, CodingKey {
            case id, kind, text
            case fromPublicKey = "from_public_key"
            case firstPublishedFromPublicKey = "fromPublicKey"
        }

        /// Reads `from_public_key` (the contract's snake_case, as all of thali-node's JSON output); an
        /// adapter written against the contract as first published may still send `fromPublicKey`.
        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            id = try container.decode(String.self, forKey: .id)
            kind = try container.decode(String.self, forKey: .kind)
            text = try container.decodeIfPresent(String.self, forKey: .text)
            fromPublicKey = try container.decodeIfPresent(String.self, forKey: .firstPublishedFromPublicKey)
                ?? container.decode(String.self, forKey: .fromPublicKey)
        }
    }

    /// Adds a contact.
    public func addContact(name: String, key: PublicKey) async throws(Failure) {
        _ = try await run(["contacts", "add", name, key.hexString(compressed: true)])
    }

    /// Queues `text` for the contact `name`; returns the item's id.
    public func send(text: String, to name: String) async throws(Failure) -> UUID {
        let output = try await run(["send", name, text, "--json"])
        struct Queued: Decodable { var id: String }
        guard let queued = try? JSONDecoder().decode(Queued.self, from: output), let id = UUID(uuidString: queued.id) else {
            throw Failure(description: "`send --json` printed no object with a UUID `id`: \(String(decoding: output.prefix(200), as: UTF8.self))")
        }
        return id
    }

    /// Reads the inbox.
    public func inbox() async throws(Failure) -> [InboxItem] {
        let output = try await run(["inbox", "--json"])
        do {
            return try JSONDecoder().decode([InboxItem].self, from: output)
        } catch {
            throw Failure(description: "`inbox --json` is not an array of items with id, from_public_key, kind: \(error)")
        }
    }

    /// Runs `command + arguments`, input closed; returns its standard output when it exits 0. Bounded by
    /// ``timeout`` whatever the verb does: its output is read with `poll` until both pipes end or the
    /// deadline, and the verb is then killed. A verb that exits but leaves a child of its own holding its
    /// output open (a daemon it started) fails at the deadline instead of holding the run forever.
    func run(_ arguments: [String]) async throws(Failure) -> Data {
        let line = (command + arguments).joined(separator: " ")
        guard let executable = command.first else { throw Failure(description: "empty adapter command") }
        let timeout = self.timeout
        let result = await Task.detached { () -> Result<Data, Failure> in
            let process = Process()
            process.executableURL = URL(fileURLWithPath: executable.contains("/") ? executable : "/usr/bin/env")
            process.arguments = (executable.contains("/") ? [] : [executable]) + Array(command.dropFirst()) + arguments
            let output = Pipe(), errors = Pipe()
            process.standardOutput = output
            process.standardError = errors
            process.standardInput = FileHandle.nullDevice
            do { try process.run() } catch { return .failure(Failure(description: "\(line): \(error)")) }
            let deadline = ContinuousClock.now + timeout
            let read = VerbOutput.read(output: output.fileHandleForReading.fileDescriptor,
                                       errors: errors.fileHandleForReading.fileDescriptor, until: deadline)
            if read.ending != .ended { kill(process.processIdentifier, SIGKILL) }
            // Foundation sees the exit once the pipes close; a child the verb left holding them delays it.
            while process.isRunning && ContinuousClock.now < deadline + .seconds(1) { usleep(10_000) }
            let errorText = String(decoding: read.errors, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            switch read.ending {
            case .tooLarge:
                return .failure(Failure(description: "\(line): more than \(ConformanceAdapter.maximumOutputBytes) bytes of output"))
            case .deadline:
                return .failure(Failure(description: "\(line): its output did not end within \(timeout) (a process it left running may hold it open)"))
            case .ended:
                break
            }
            guard !process.isRunning else {
                return .failure(Failure(description: "\(line): its output ended but it did not exit within \(timeout)"))
            }
            guard process.terminationReason == .exit, process.terminationStatus == 0 else {
                return .failure(Failure(description: "\(line): exit \(process.terminationStatus): \(errorText)"))
            }
            return .success(read.output)
        }.value
        return try result.get()
    }
}

/// What a verb printed, read from both of its pipes at once (so that a verb writing much to standard
/// error cannot stall on a full pipe while standard output is read), until both end or a deadline.
struct VerbOutput {
    /// How the reading ended.
    enum Ending: Equatable {
        /// Both pipes reached their end.
        case ended
        /// The deadline came first.
        case deadline
        /// Standard output passed ``ConformanceAdapter/maximumOutputBytes``.
        case tooLarge
    }

    /// The bytes of standard error kept for a failure's message; the rest is read and dropped.
    static let keptErrorBytes = 4096

    var output = Data()
    var errors = Data()
    var ending = Ending.ended

    /// Reads `output` and `errors` until both end, the deadline, or too much output.
    static func read(output: Int32, errors: Int32, until deadline: ContinuousClock.Instant) -> VerbOutput {
        var result = VerbOutput()
        var open: [Int32] = [output, errors]
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while !open.isEmpty {
            let left = deadline - ContinuousClock.now
            guard left > .zero else {
                result.ending = .deadline
                return result
            }
            var fds = open.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            let milliseconds = Int32(clamping: max(1, left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000))
            let ready = poll(&fds, nfds_t(fds.count), milliseconds)
            if ready < 0 && errno == EINTR { continue }
            guard ready > 0 else { continue }
            for entry in fds where entry.revents != 0 {
                let count = buffer.withUnsafeMutableBytes { Glibc.read(entry.fd, $0.baseAddress, $0.count) }
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else {
                    open.removeAll { $0 == entry.fd }
                    continue
                }
                if entry.fd == output {
                    result.output.append(contentsOf: buffer.prefix(count))
                    if result.output.count > ConformanceAdapter.maximumOutputBytes {
                        result.ending = .tooLarge
                        return result
                    }
                } else if result.errors.count < keptErrorBytes {
                    result.errors.append(contentsOf: buffer.prefix(min(count, keptErrorBytes - result.errors.count)))
                }
            }
        }
        return result
    }
}
