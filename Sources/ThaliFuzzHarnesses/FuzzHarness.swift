/// One fuzzing surface: a named entry point that takes arbitrary bytes, drives one of the suite's parsers
/// or state machines with them, and checks what it can about the result.
///
/// The same entry point serves libFuzzer (the `Fuzz/` package links one executable per harness) and the
/// corpus replay in the tests, so an input that once crashed or broke an invariant fails CI forever after.
/// Harnesses keep their expensive objects (keys, TLS contexts, address books) between inputs and must
/// not carry any other state from one input to the next.
public struct FuzzHarness: Sendable {
    /// The harness's name: its corpus folder (`Fuzz/Corpus/<name>`) and its argument to `scripts/fuzz.sh`.
    public let name: String
    /// One line on the surface it covers.
    public let summary: String
    private let body: @Sendable (inout FuzzInput) throws(FuzzInvariantViolation) -> Void
    private let makeSeeds: @Sendable () -> [[UInt8]]

    init(name: String, summary: String, seeds: @escaping @Sendable () -> [[UInt8]],
         body: @escaping @Sendable (inout FuzzInput) throws(FuzzInvariantViolation) -> Void) {
        self.name = name
        self.summary = summary
        self.makeSeeds = seeds
        self.body = body
    }

    /// Valid inputs built from the suite's own generators (announcements, frames, handshakes), written
    /// to `Fuzz/Corpus/<name>/` by `scripts/fuzz.sh --seed` so that the fuzzer starts past the first gates.
    public func seeds() -> [[UInt8]] { makeSeeds() }

    /// Runs one input. Throws only when an invariant of the surface is broken (a typed parse error is an
    /// expected outcome, not a finding); a crash is a finding too.
    public func run(_ bytes: UnsafeRawBufferPointer) throws(FuzzInvariantViolation) {
        var input = FuzzInput(bytes)
        try body(&input)
    }

    /// Runs one input given as an array (the corpus replay).
    public func run(_ bytes: [UInt8]) throws(FuzzInvariantViolation) {
        var input = FuzzInput(bytes)
        try body(&input)
    }
}

/// An invariant a harness checks did not hold: the finding, with what was expected and what happened.
public struct FuzzInvariantViolation: Error, CustomStringConvertible, Sendable {
    /// The harness that found it.
    public var harness: String
    /// What was expected and what happened instead.
    public var detail: String

    /// Creates a violation report.
    public init(harness: String, detail: String) {
        self.harness = harness
        self.detail = detail
    }

    /// `<harness>: <detail>`.
    public var description: String { "\(harness): \(detail)" }
}

/// Every harness, by name.
public enum FuzzHarnesses {
    /// All harnesses, in the order `scripts/fuzz.sh --list` prints them.
    public static let all: [FuzzHarness] = [
        BeaconStreamHarness.harness,
        SSDPDatagramHarness.harness,
        BeaconHTTPResponseHarness.harness,
        BeaconHTTPRequestHarness.harness,
        MultiplexerSessionHarness.yamux,
        MultiplexerSessionHarness.thaliMultiplex,
        MultiplexerPairHarness.yamux,
        MultiplexerPairHarness.thaliMultiplex,
        DeliveryFramesHarness.harness,
        DeliveryPairHarness.harness,
        AdvertisingDataHarness.harness,
        BluetoothHandshakeHarness.harness,
        DBusMessageHarness.harness,
        IdentityKeyFileHarness.harness,
        NodeConfigurationHarness.harness,
        ConformanceVectorHarness.harness,
        PSKTLSServerHarness.harness,
        PSKTLSPairHarness.harness,
        TLSHelloFlightHarness.harness,
        SSDPSearchAnswersHarness.harness,
        StreamHeaderHarness.harness,
        AdapterEventsHarness.harness,
        RawYamuxInputHarness.harness,
        NodeEventHarness.harness,
        EthernetHeaderHarness.harness,
    ]

    /// The harness called `name`, if any.
    public static func named(_ name: String) -> FuzzHarness? { all.first { $0.name == name } }
}

/// The fuzzer's bytes read as a script: numbers, choices and chunks taken from the front. Once the bytes
/// run out every read returns zero or empty, so any prefix of an input is itself a valid (shorter) script.
public struct FuzzInput {
    private let bytes: [UInt8]
    private var offset = 0

    init(_ buffer: UnsafeRawBufferPointer) { bytes = Array(buffer) }
    init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// Whether every byte has been read.
    public var isEmpty: Bool { offset >= bytes.count }
    /// How many bytes are left.
    public var remainingCount: Int { max(0, bytes.count - offset) }

    /// The next byte, or 0 at the end.
    public mutating func byte() -> UInt8 {
        guard offset < bytes.count else { return 0 }
        defer { offset += 1 }
        return bytes[offset]
    }

    /// A little-endian 16-bit number.
    public mutating func uint16() -> UInt16 { UInt16(byte()) | UInt16(byte()) << 8 }

    /// A number in `0..<bound` (`bound` > 0), from one or two bytes.
    public mutating func int(below bound: Int) -> Int {
        precondition(bound > 0)
        return bound <= 256 ? Int(byte()) % bound : Int(uint16()) % bound
    }

    /// A boolean.
    public mutating func bool() -> Bool { byte() & 1 == 1 }

    /// Up to `count` next bytes.
    public mutating func bytes(_ count: Int) -> [UInt8] {
        let end = min(bytes.count, offset + max(0, count))
        defer { offset = max(offset, end) }
        return offset < end ? Array(bytes[offset..<end]) : []
    }

    /// Everything not read yet.
    public mutating func rest() -> [UInt8] { bytes(remainingCount) }
}

/// Throws a violation for `harness` unless `condition` holds.
@inline(__always)
func check(_ condition: @autoclosure () -> Bool, _ harness: String, _ detail: @autoclosure () -> String)
    throws(FuzzInvariantViolation)
{
    if !condition() { throw FuzzInvariantViolation(harness: harness, detail: detail()) }
}

/// Holds what a future completed with, for harnesses that run everything on one embedded loop.
final class OutcomeBox<Value>: @unchecked Sendable {
    var value: Value?
}
