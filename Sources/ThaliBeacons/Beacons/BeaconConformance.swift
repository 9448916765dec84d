import Foundation
import ThaliSupport

/// Checks an implementation against conformance vectors in the `thali-beacon-vectors/1` format
/// (`spec/vectors/README.md`): for every case, the generated stream byte for byte, each beacon's PSK
/// identity and secret, and the outcome of every parse (match index and sender, or reject reason).
///
/// `thali-node conformance beacons FILE...` prints these results; tests call the same functions.
public enum BeaconConformance {
    /// The format name a vector file must declare.
    public static let format = "thali-beacon-vectors/1"

    /// One way the implementation's result differs from a vector.
    public struct Difference: Sendable, Hashable, CustomStringConvertible {
        /// The vector file, as named by the caller.
        public var file: String
        /// The case id (empty for a problem with the file itself).
        public var caseId: String
        /// What was compared, e.g. `stream`, `beacons[2].psk_secret`, `parses[1].outcome`.
        public var field: String
        /// The vector's value.
        public var expected: String
        /// Ours.
        public var got: String

        public var description: String {
            let place = caseId.isEmpty ? file : "\(file) \(caseId)"
            return "\(place) \(field): expected \(expected), got \(got)"
        }
    }

    /// The outcome of checking one or more files.
    public struct Report: Sendable, Hashable {
        /// Cases with no difference.
        public var passed = 0
        /// Cases with at least one difference, plus files that could not be read.
        public var failed = 0
        /// Every difference, in file and case order.
        public var differences: [Difference] = []

        /// An empty report.
        public init() {}

        /// Adds another report's counts and differences.
        public mutating func merge(_ other: Report) {
            passed += other.passed
            failed += other.failed
            differences += other.differences
        }
    }

    /// A vector file.
    public struct VectorFile: Decodable, Sendable {
        /// Must be `thali-beacon-vectors/1`.
        public var format: String
        /// `spec` or `cordova`.
        public var profile: String
        /// The cases.
        public var cases: [VectorCase]
    }

    /// One generation and the parses of its stream.
    public struct VectorCase: Decodable, Sendable {
        /// Unique within the file.
        public var id: String
        /// Sender identity (hex, 32 bytes).
        public var senderPrivateKey: String
        /// Ephemeral key (hex, 32 bytes).
        public var ephemeralPrivateKey: String
        /// The expiration written in the stream.
        public var expirationMilliseconds: UInt64
        /// Receivers in beacon order (hex SEC1).
        public var receiverPublicKeys: [String]
        /// Expected generator output (hex).
        public var stream: String
        /// Expected PSK identity and secret per beacon.
        public var beacons: [VectorBeacon]
        /// Parses of the stream (or of a variant) and their expected outcomes.
        public var parses: [VectorParse]

        enum CodingKeys: String, CodingKey {
            case id, stream, beacons, parses
            case senderPrivateKey = "sender_private_key", ephemeralPrivateKey = "ephemeral_private_key"
            case expirationMilliseconds = "expiration_ms", receiverPublicKeys = "receiver_public_keys"
        }
    }

    /// A beacon's PSK as the sender's server must accept it.
    public struct VectorBeacon: Decodable, Sendable {
        /// The PSK identity.
        public var pskIdentity: String
        /// The PSK (hex).
        public var pskSecret: String

        enum CodingKeys: String, CodingKey {
            case pskIdentity = "psk_identity", pskSecret = "psk_secret"
        }
    }

    /// One parse and its expected outcome.
    public struct VectorParse: Decodable, Sendable {
        /// What the parse is about.
        public var description: String?
        /// The receiver's identity (hex).
        public var receiverPrivateKey: String
        /// The receiver's clock.
        public var nowMilliseconds: UInt64
        /// Contacts the receiver knows (hex SEC1).
        public var addressBook: [String]
        /// A variant of the case's stream, when present.
        public var stream: String?
        /// Either a match or a reject reason.
        public var expect: Expectation

        enum CodingKeys: String, CodingKey {
            case description, stream, expect
            case receiverPrivateKey = "receiver_private_key", nowMilliseconds = "now_ms", addressBook = "address_book"
        }
    }

    /// The expected outcome of a parse.
    public struct Expectation: Decodable, Sendable {
        /// Index of the matching beacon.
        public var match: Int?
        /// The sender a match reports (hex, uncompressed).
        public var senderPublicKey: String?
        /// The reject reason (`BeaconRejection.Reason` raw value).
        public var reject: String?

        enum CodingKeys: String, CodingKey {
            case match, reject
            case senderPublicKey = "sender_public_key"
        }
    }

    /// Reads and checks the vector file at `path`.
    public static func check(contentsOf path: String) -> Report {
        guard let data = FileManager.default.contents(atPath: path) else {
            return fileFailure(path, "a readable file", "cannot read it")
        }
        return check(json: data, file: path)
    }

    /// Decodes and checks a vector file's JSON; `file` names it in the differences.
    public static func check(json data: Data, file: String) -> Report {
        let vectors: VectorFile
        do {
            vectors = try JSONDecoder().decode(VectorFile.self, from: data)
        } catch {
            return fileFailure(file, "JSON in the \(format) format", "\(error)")
        }
        guard vectors.format == format else { return fileFailure(file, "format \(format)", "format \(vectors.format)") }
        guard let profile = BeaconProfile(rawValue: vectors.profile) else {
            return fileFailure(file, "profile spec or cordova", "profile \(vectors.profile)")
        }
        var report = Report()
        for vectorCase in vectors.cases {
            let differences = check(vectorCase, profile: profile, file: file)
            if differences.isEmpty { report.passed += 1 } else { report.failed += 1 }
            report.differences += differences
        }
        return report
    }

    /// Checks one case: generation, PSKs, then every parse (each with a fresh receiver).
    public static func check(_ vector: VectorCase, profile: BeaconProfile, file: String) -> [Difference] {
        var differences: [Difference] = []
        func differ(_ field: String, _ expected: String, _ got: String) {
            differences.append(Difference(file: file, caseId: vector.id, field: field, expected: expected, got: got))
        }

        // Generation.
        do {
            let sender = try PrivateKey(hex: vector.senderPrivateKey)
            let ephemeral = try PrivateKey(hex: vector.ephemeralPrivateKey)
            let receivers = try vector.receiverPublicKeys.map { (hex) throws(KeyError) in try PublicKey(hex: hex) }
            let limits = BeaconLimits(maximumBeaconsPerAnnouncement: max(receivers.count, BeaconLimits().maximumBeaconsPerAnnouncement))
            let generator = BeaconGenerator(identity: sender, profile: profile, limits: limits)
            let announcement = try generator.makeAnnouncement(
                for: receivers, expiration: vector.expirationMilliseconds, ephemeralKey: ephemeral)
            if let expected = Hex.decode(vector.stream) {
                if let (want, have) = describeDifference(expected: expected, got: announcement.stream) {
                    differ("stream", want, have)
                }
            } else {
                differ("stream", "hex", "not hex in the vector")
            }
            if announcement.beacons.count != vector.beacons.count {
                differ("beacons.count", "\(vector.beacons.count)", "\(announcement.beacons.count)")
            }
            for (index, (want, have)) in zip(vector.beacons, announcement.beacons).enumerated() {
                if want.pskIdentity != have.pskIdentity {
                    differ("beacons[\(index)].psk_identity", want.pskIdentity, have.pskIdentity)
                }
                if want.pskSecret.lowercased() != Hex.encode(have.psk) {
                    differ("beacons[\(index)].psk_secret", want.pskSecret.lowercased(), Hex.encode(have.psk))
                }
            }
        } catch {
            differ("generation", "a stream", "error \(error)")
        }

        // Parses.
        for (index, parse) in vector.parses.enumerated() {
            let about = parse.description.map { " (\($0))" } ?? ""
            func field(_ name: String) -> String { "parses[\(index)].\(name)\(about)" }
            let expected: String
            switch (parse.expect.match, parse.expect.reject) {
            case (let match?, nil): expected = "match \(match) from \(parse.expect.senderPublicKey ?? "?")"
            case (nil, let reject?): expected = "reject \(reject)"
            default:
                differ(field("expect"), "one of match or reject", "neither or both")
                continue
            }
            let got: String
            let matched: BeaconMatch?
            do {
                guard let stream = Hex.decode(parse.stream ?? vector.stream) else {
                    differ(field("stream"), "hex", "not hex in the vector")
                    continue
                }
                // Limits wide enough for any vector: the checks under test are the wire format's.
                var limits = BeaconLimits()
                limits.maximumBeaconsPerAnnouncement = max(limits.maximumBeaconsPerAnnouncement, stream.count / BeaconWire.beaconLength)
                limits.addressBookCapacity = max(limits.addressBookCapacity, parse.addressBook.count)
                let receiver = BeaconReceiver(
                    identity: try PrivateKey(hex: parse.receiverPrivateKey), profile: profile, limits: limits)
                try receiver.addressBook.add(contentsOf: parse.addressBook.map { (hex) throws(KeyError) in try PublicKey(hex: hex) })
                do {
                    let match = try receiver.receive(stream, now: parse.nowMilliseconds)
                    got = "match \(match.beaconIndex) from \(match.sender.hexString())"
                    matched = match
                } catch {
                    got = "reject \(error.reason.rawValue)"
                    matched = nil
                }
            } catch {
                differ(field("keys"), "valid receiver and address-book keys", "error \(error)")
                continue
            }
            // Compare senders as points so that either encoding in the vector is accepted.
            let expectedSender = parse.expect.senderPublicKey.flatMap { try? PublicKey(hex: $0) }
            let same: Bool
            if let match = parse.expect.match, let matched {
                same = match == matched.beaconIndex && expectedSender == matched.sender
            } else {
                same = expected == got
            }
            if !same { differ(field("outcome"), expected, got) }
            // The receiver's PSK must be the one the sender's server accepts for that beacon.
            if same, let matched, matched.beaconIndex < vector.beacons.count {
                let beacon = vector.beacons[matched.beaconIndex]
                if beacon.pskIdentity != matched.pskIdentity {
                    differ(field("psk_identity"), beacon.pskIdentity, matched.pskIdentity)
                }
                if beacon.pskSecret.lowercased() != Hex.encode(matched.psk) {
                    differ(field("psk_secret"), beacon.pskSecret.lowercased(), Hex.encode(matched.psk))
                }
            }
        }
        return differences
    }

    private static func fileFailure(_ file: String, _ expected: String, _ got: String) -> Report {
        var report = Report()
        report.failed = 1
        report.differences = [Difference(file: file, caseId: "", field: "file", expected: expected, got: got)]
        return report
    }

    /// `nil` when equal; otherwise the first differing byte's offset with up to 8 bytes of each side.
    static func describeDifference(expected: [UInt8], got: [UInt8]) -> (String, String)? {
        guard expected != got else { return nil }
        let common = min(expected.count, got.count)
        let first = (0..<common).first { expected[$0] != got[$0] } ?? common
        func window(_ bytes: [UInt8]) -> String {
            let slice = bytes[min(first, bytes.count)..<min(first + 8, bytes.count)]
            return "\(bytes.count) bytes, \(slice.isEmpty ? "ending" : Hex.encode(slice) + (first + 8 < bytes.count ? "…" : "")) at byte \(first)"
        }
        return (window(expected), window(got))
    }
}
