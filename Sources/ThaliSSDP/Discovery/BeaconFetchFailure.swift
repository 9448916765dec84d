/// Why a peer's beacons were not read: the kind, which discovery counts and its limits weigh, and the
/// detail in words.
public struct BeaconFetchFailure: Hashable, Sendable, CustomStringConvertible {
    /// The kinds of failure, from "nothing answered" to "an answer we could not use".
    public enum Kind: String, Hashable, Sendable, CaseIterable, Codable, CodingKeyRepresentable, CustomStringConvertible {
        /// No TCP connection: refused or unreachable at once.
        case noConnection = "no_connection"
        /// No TCP connection within the connect timeout: nothing answered.
        case connectTimedOut = "connect_timed_out"
        /// Connected, but no complete response within the response timeout.
        case responseTimedOut = "response_timed_out"
        /// Connected, and closed before the response ended (a busy or refusing server does that).
        case closedEarly = "closed_early"
        /// A response we could not use: its status, type, size or syntax.
        case badResponse = "bad_response"
        /// Not fetched: its source is being ignored, or the fetch queue was full.
        case notMade = "not_made"

        /// Whether the failure says that unicast to the peer may be blocked: no TCP connection came
        /// up. Any connection, even one closed at once, proves that unicast works (`spec/ssdp.md` §7).
        public var suggestsUnicastBlocked: Bool { self == .noConnection || self == .connectTimedOut }

        /// The snake-case name used in JSON.
        public var description: String { rawValue }
    }

    /// What kind of failure.
    public var kind: Kind
    /// What happened, in words.
    public var detail: String

    /// A failure of `kind`, described by `detail`.
    public init(_ kind: Kind, _ detail: String) {
        self.kind = kind
        self.detail = detail
    }

    public var description: String { detail }
}
