import Foundation
import ThaliBeacons
import ThaliSupport

/// The framings that frame vectors cover (spec/vectors/README.md).
public enum FrameVectorLayer: String, Sendable, Hashable, Codable, CaseIterable {
    /// The delivery protocol's frames (spec/node.md, "Delivery protocol").
    case delivery
    /// yamux frames (spec/multiplexer.md, "yamux").
    case yamux
    /// Thali's `thali-multiplex` frames (spec/multiplexer.md, "thali-multiplex").
    case thaliMultiplex = "thali-multiplex"
    /// BLE advertising payloads (spec/ble-binding.md, section 1): one "frame" per case at most, the
    /// Thali claim the payload carries.
    case advertisingData = "advdata"

    /// The file name the set is published under in `spec/vectors/`.
    public var fileName: String { isStream ? "frames-\(rawValue).json" : "\(rawValue).json" }

    /// Whether a case's bytes are the start of a stream, read as they arrive (a cut inside a frame is
    /// `incomplete`), rather than one message that arrives whole (an advertising payload: a cut is
    /// `invalid`).
    public var isStream: Bool { self != .advertisingData }

    /// Whether the frames of a `valid` case determine its bytes, so that an encoder given them must
    /// write exactly those bytes. Not for advertising payloads, whose "frame" is the claim found in them,
    /// not every structure around it.
    public var framesDetermineBytes: Bool { self != .advertisingData }

    /// The type of the first frame header in `bytes`, spelled as the cases' `type` field spells it; nil for
    /// a layer without a type byte in a fixed place (thali-multiplex, advdata) or bytes too short.
    func firstFrameType(_ bytes: [UInt8]) -> String? {
        switch self {
        case .delivery:
            let names = ["hello", "offer", "answer", "start", "data", "end", "ack", "reject", "done", "welcome", "error", "progress", "item"]
            guard let type = bytes.first, (1...names.count).contains(Int(type)) else { return nil }
            return names[Int(type) - 1]
        case .yamux:
            let names = ["data", "window-update", "ping", "go-away"]
            guard bytes.count > 1, Int(bytes[1]) < names.count else { return nil }
            return names[Int(bytes[1])]
        case .thaliMultiplex, .advertisingData:
            return nil
        }
    }
}

/// What a decoder must conclude from a case's bytes, read as the start of a connection.
public enum FrameVectorOutcome: String, Sendable, Hashable, Codable, CaseIterable {
    /// The bytes are exactly the listed frames, whole.
    case valid
    /// The bytes can never become valid: the decoder reports a protocol error (at the latest when the
    /// first impossible byte arrived).
    case invalid
    /// The bytes are a valid beginning but end inside a frame: the decoder waits for more and reports
    /// no error. Any whole frames before the cut are listed.
    case incomplete
    /// Either `valid` (with the listed frames) or `invalid` is conforming: the spec leaves it open (in
    /// the manner of Wycheproof's "acceptable"). Not a possible answer, only an expectation.
    case acceptable
}

/// One frame as vectors and answers write it: field names to values, every value a string. Integers are
/// decimal (64-bit values do not survive JSON numbers in every language), byte strings lowercase hex,
/// text as itself. The fields of each framing are listed in spec/vectors/README.md.
public typealias FrameFields = [String: String]

/// One input of a vector set and what a decoder must make of it.
public struct FrameVectorCase: Sendable, Hashable, Codable {
    /// A stable id within the set (`D-offer-file`).
    public var id: String
    /// What the case is, in a few words.
    public var description: String
    /// The requirement ids (spec/requirements.json) the case grades.
    public var requirements: [String]
    /// The bytes, lowercase hex.
    public var bytes: String
    /// What a decoder must conclude.
    public var expect: FrameVectorOutcome
    /// For `valid`, `acceptable` and `incomplete`: the whole frames the bytes hold, in order. An encoder
    /// given the frames of a `valid` case writes exactly `bytes` (where the layer's
    /// ``FrameVectorLayer/framesDetermineBytes``).
    public var frames: [FrameFields]?
    /// For `invalid`: this implementation's name for the error (informative; answers need not match it).
    public var error: String?

    /// A case.
    public init(id: String, description: String, requirements: [String], bytes: [UInt8], expect: FrameVectorOutcome,
                frames: [FrameFields]? = nil, error: String? = nil) {
        self.id = id
        self.description = description
        self.requirements = requirements
        self.bytes = Hex.encode(bytes)
        self.expect = expect
        self.frames = frames
        self.error = error
    }
}

/// A set of frame vectors for one framing (format `thali-frame-vectors/1`).
public struct FrameVectorSet: Sendable, Hashable, Codable {
    /// The format name.
    public static let format = "thali-frame-vectors/1"

    /// Always ``format``.
    public var format: String
    /// The framing.
    public var layer: FrameVectorLayer
    /// Where the cases and their expectations come from.
    public var source: String
    /// The decoder settings the cases assume (`max_frame_payload_bytes` ...), each the spec's default.
    public var limits: [String: Int]
    /// The cases, in order.
    public var cases: [FrameVectorCase]

    /// A set.
    public init(layer: FrameVectorLayer, source: String, limits: [String: Int], cases: [FrameVectorCase]) {
        format = Self.format
        self.layer = layer
        self.source = source
        self.limits = limits
        self.cases = cases
    }

    /// The conformance case that grades vector `vector` of this set.
    public func conformanceCase(_ vector: FrameVectorCase) -> ConformanceCase {
        ConformanceCase("vectors/\(layer.rawValue)/\(vector.id)", vector.description, vector.requirements)
    }

    /// The set as published: pretty-printed JSON with sorted keys and a final newline, so a
    /// regenerated file differs from the committed one only where a case changed.
    public func json() -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        // Encoding plain strings, integers and arrays of them cannot fail.
        var data = (try? encoder.encode(self)) ?? Data()
        data.append(0x0a)
        return data
    }

    /// Reads a set, refusing other formats and files over ``FrameVectorError/maximumFileBytes``.
    public static func load(from path: String) throws(FrameVectorError) -> FrameVectorSet {
        try FrameVectorError.decode(FrameVectorSet.self, from: path, naming: "a frame vector set", format: \.format, expected: format)
    }
}

/// What an implementation under test concluded for one case.
public struct FrameVectorAnswer: Sendable, Hashable, Codable {
    /// The case id.
    public var id: String
    /// `valid`, `invalid` or `incomplete`.
    public var result: FrameVectorOutcome
    /// The whole frames it read (for `valid` and `incomplete`).
    public var frames: [FrameFields]?
    /// Its own error text for `invalid` (shown, not graded).
    public var error: String?
    /// Optional, for `invalid`: the class of the error in the vectors' names (`unknown-frame-type`,
    /// `frame-too-large`, `malformed`, ...); when given it must be the case's.
    public var errorClass: String?
    /// Optional, for `valid` cases: what its encoder writes for the case's frames, lowercase hex.
    public var encoded: String?

    enum CodingKeys: String, CodingKey {
        case id, result, frames, error, encoded
        case errorClass = "error_class"
    }

    /// An answer.
    public init(id: String, result: FrameVectorOutcome, frames: [FrameFields]? = nil, error: String? = nil,
                errorClass: String? = nil, encoded: String? = nil) {
        self.id = id
        self.result = result
        self.frames = frames
        self.error = error
        self.errorClass = errorClass
        self.encoded = encoded
    }
}

/// An implementation's answers to one vector set (format `thali-frame-answers/1`): what the
/// implementation under test writes, and `thali-node conformance vectors answer` writes for ours.
public struct FrameVectorAnswers: Sendable, Hashable, Codable {
    /// The format name.
    public static let format = "thali-frame-answers/1"

    /// Always ``format``.
    public var format: String
    /// The framing answered.
    public var layer: FrameVectorLayer
    /// Who answered (free text).
    public var implementation: String
    /// One answer per case; cases without one are INCONCLUSIVE.
    public var answers: [FrameVectorAnswer]

    /// A set of answers.
    public init(layer: FrameVectorLayer, implementation: String, answers: [FrameVectorAnswer]) {
        format = Self.format
        self.layer = layer
        self.implementation = implementation
        self.answers = answers
    }

    /// Reads answers, refusing other formats and files over ``FrameVectorError/maximumFileBytes``.
    public static func load(from path: String) throws(FrameVectorError) -> FrameVectorAnswers {
        try FrameVectorError.decode(FrameVectorAnswers.self, from: path, naming: "a set of frame answers", format: \.format, expected: format)
    }
}

/// Why a vector or answer file could not be used.
public struct FrameVectorError: Error, Hashable, CustomStringConvertible {
    /// What was wrong, with the file named.
    public let description: String

    /// The largest vector or answer file read.
    public static let maximumFileBytes = 16 << 20

    /// Decodes the JSON file at `path` as `T`, whose `format` must be `expected`.
    static func decode<T: Decodable>(_ type: T.Type, from path: String, naming what: String, format: KeyPath<T, String>,
                                     expected: String) throws(FrameVectorError) -> T {
        let data: Data
        do {
            data = try BoundedFile.read(path, maximumBytes: maximumFileBytes)
        } catch {
            throw FrameVectorError(description: error.description)
        }
        let value: T
        do {
            value = try JSONDecoder().decode(T.self, from: data)
        } catch {
            throw FrameVectorError(description: "\(path) is not \(what): \(error)")
        }
        guard value[keyPath: format] == expected else {
            throw FrameVectorError(description: "\(path): format \(value[keyPath: format]), expected \(expected)")
        }
        return value
    }
}

/// Grades an implementation's answers against a vector set.
public enum FrameVectorGrading {
    /// Records one result per case of `set` in `run`: PASS when the answer is what the case expects;
    /// FAIL (WARN for a case grading only SHOULD or PROFILE rules) when it is not; INCONCLUSIVE when there
    /// is no answer. A `valid` answer must list exactly the expected frames, and an `encoded` form, when
    /// given for a `valid` case of a layer whose frames determine the bytes, must be its bytes.
    public static func grade(_ answers: FrameVectorAnswers, against set: FrameVectorSet, in run: ConformanceRun) {
        var byID: [String: FrameVectorAnswer] = [:]
        for answer in answers.answers where byID[answer.id] == nil { byID[answer.id] = answer }
        if answers.layer != set.layer {
            run.note("the answers are for \(answers.layer.rawValue), the vectors for \(set.layer.rawValue)")
        }
        // The frame types it decodes: those of the cases with frames that it read right. A rejection of a
        // malformed frame of a type it decodes in no case shows nothing of the rule the case is about.
        var decoded: Set<String> = []
        var decodedIn: [String: [String]] = [:]  // type -> ids of the cases with frames of that type
        for vector in set.cases where vector.expect != .invalid {
            let types = Set((vector.frames ?? []).compactMap { $0["type"] })
            for type in types { decodedIn[type, default: []].append(vector.id) }
            if let answer = byID[vector.id], answers.layer == set.layer, [.valid, .incomplete].contains(answer.result), judge(answer, vector).0 {
                decoded.formUnion(types)
            }
        }
        for vector in set.cases {
            let testCase = set.conformanceCase(vector)
            let expected = describe(vector)
            guard var answer = byID[vector.id], answers.layer == set.layer else {
                run.record(testCase, .inconclusive, expected: expected, actual: "no answer for this case")
                continue
            }
            if !set.layer.framesDetermineBytes { answer.encoded = nil }
            let (holds, actual) = judge(answer, vector)
            if holds, vector.expect == .invalid, vector.error == malformedClass, let type = set.layer.firstFrameType(Hex.decode(vector.bytes) ?? []),
               let cases = decodedIn[type], !decoded.contains(type) {
                run.record(testCase, .inconclusive, expected: expected,
                           actual: "\(actual), but it reads no \(type) frame right (\(cases.prefix(3).joined(separator: ", "))): the rejection "
                               + "shows nothing of the rule this case is about")
                continue
            }
            run.grade(testCase, holds: holds, expected: expected, actual: actual)
        }
        let known = Set(set.cases.map(\.id))
        let unknown = answers.answers.map(\.id).filter { !known.contains($0) }
        if !unknown.isEmpty { run.note("answers for cases the set does not have: \(unknown.prefix(5).joined(separator: ", "))") }
    }

    /// Whether `answer` is what `vector` expects, and the answer in words.
    static func judge(_ answer: FrameVectorAnswer, _ vector: FrameVectorCase) -> (Bool, String) {
        let actual = describe(answer)
        let framesMatch = answer.frames ?? [] == vector.frames ?? []
        switch vector.expect {
        case .valid:
            guard answer.result == .valid, framesMatch else { return (false, actual) }
            if let encoded = answer.encoded, encoded.lowercased() != vector.bytes {
                return (false, "decoded right, but its encoder wrote \(abbreviated(encoded.lowercased()))")
            }
            return (true, actual)
        case .invalid:
            // An error class, when the answer gives one, must be the case's: a rejection for another
            // reason did not reach the rule the case is about.
            if answer.result == .invalid, let named = answer.errorClass, let reason = vector.error, named != reason {
                return (false, "\(actual), but as \(named), not as \(reason)")
            }
            return (answer.result == .invalid, actual)
        case .incomplete:
            return (answer.result == .incomplete && framesMatch, actual)
        case .acceptable:
            return (answer.result == .invalid || (answer.result == .valid && framesMatch), actual)
        }
    }

    /// The vectors' error class of a frame whose type is known but whose payload breaks its layout.
    static let malformedClass = "malformed"

    static func describe(_ vector: FrameVectorCase) -> String {
        switch vector.expect {
        case .valid: "valid: \(describe(vector.frames ?? []))"
        case .invalid: "invalid (\(vector.error ?? "a protocol error"))"
        case .incomplete: "incomplete, waiting for more" + ((vector.frames ?? []).isEmpty ? "" : " after \(describe(vector.frames ?? []))")
        case .acceptable: "valid as \(describe(vector.frames ?? [])), or invalid"
        }
    }

    static func describe(_ answer: FrameVectorAnswer) -> String {
        switch answer.result {
        case .valid: "valid: \(describe(answer.frames ?? []))"
        case .invalid: "invalid" + (answer.error.map { " (\($0))" } ?? "")
        case .incomplete: "incomplete" + ((answer.frames ?? []).isEmpty ? "" : " after \(describe(answer.frames ?? []))")
        case .acceptable: "acceptable (not an answer)"
        }
    }

    static func describe(_ frames: [FrameFields]) -> String {
        let text = frames.map { frame in
            "{" + frame.keys.sorted().map { "\($0): \(abbreviated(frame[$0] ?? ""))" }.joined(separator: ", ") + "}"
        }.joined(separator: " ")
        return frames.isEmpty ? "no frames" : text
    }

    static func abbreviated(_ text: String) -> String {
        text.count <= 80 ? text : String(text.prefix(72)) + "…(\(text.count))"
    }
}

/// Reading a file of bounded size, so that a wrong path cannot make the suite load a huge file.
enum BoundedFile {
    /// Why a file could not be read, with its path.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// The contents of `path`, at most `maximumBytes` long.
    static func read(_ path: String, maximumBytes: Int) throws(Failure) -> Data {
        guard let handle = FileHandle(forReadingAtPath: path) else { throw Failure(description: "cannot open \(path)") }
        defer { try? handle.close() }
        let data: Data
        do {
            data = try handle.read(upToCount: maximumBytes + 1) ?? Data()
        } catch {
            throw Failure(description: "cannot read \(path): \(error)")
        }
        guard data.count <= maximumBytes else { throw Failure(description: "\(path) is larger than \(maximumBytes) bytes") }
        return data
    }
}
