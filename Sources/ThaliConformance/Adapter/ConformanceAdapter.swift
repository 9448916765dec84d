import Foundation
import ThaliBeacons

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

    /// Runs `command + arguments`, input closed; returns its standard output when it exits 0.
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
            // Killed at the deadline, so a hung adapter cannot hang the run (cancelled once it exited, before
            // its pid could be reused).
            let pid = process.processIdentifier
            let deadline = DispatchWorkItem { kill(pid, SIGKILL) }
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(Int(timeout.components.seconds * 1000)),
                                              execute: deadline)
            var collected = Data()
            while let chunk = try? output.fileHandleForReading.read(upToCount: 64 << 10), !chunk.isEmpty {
                collected.append(chunk)
                if collected.count > ConformanceAdapter.maximumOutputBytes {
                    process.terminate()
                    break
                }
            }
            let errorText = (try? errors.fileHandleForReading.read(upToCount: 4096)).map { String(decoding: $0, as: UTF8.self) } ?? ""
            process.waitUntilExit()
            deadline.cancel()
            guard collected.count <= ConformanceAdapter.maximumOutputBytes else {
                return .failure(Failure(description: "\(line): more than \(ConformanceAdapter.maximumOutputBytes) bytes of output"))
            }
            guard process.terminationReason == .exit, process.terminationStatus == 0 else {
                return .failure(Failure(description: "\(line): exit \(process.terminationStatus): \(errorText.trimmingCharacters(in: .whitespacesAndNewlines))"))
            }
            return .success(collected)
        }.value
        return try result.get()
    }
}
