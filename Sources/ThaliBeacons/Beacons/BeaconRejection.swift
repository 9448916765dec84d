/// Why a receiver did not accept a beacon stream. Reasons are checked in the order of `Reason`'s
/// cases; the raw values are the names used by the conformance vectors.
public struct BeaconRejection: Error, Hashable, Sendable, CustomStringConvertible {
    /// The reject reasons, in the order a receiver checks them.
    public enum Reason: String, Hashable, Sendable, CaseIterable {
        /// The length is not ephemeral key + 8 + 48·N with 1 ≤ N ≤ the configured maximum.
        case malformed = "malformed"
        /// The ephemeral key is not a valid encoding of a point on secp256k1.
        case invalidKey = "invalid-key"
        /// The expiration is before now.
        case expired = "expired"
        /// The expiration is more than 24 h after now.
        case tooFarInFuture = "too-far-in-future"
        /// The ephemeral key was seen before (checked before any ECDH; not part of the vectors).
        case replayed = "replayed"
        /// No beacon is for us from a contact in the address book.
        case noMatch = "no-match"
    }

    /// The reason.
    public var reason: Reason
    /// Context for logs: lengths, times, the beacon that stopped the scan.
    public var detail: String

    /// Creates a rejection.
    public init(_ reason: Reason, _ detail: String) {
        self.reason = reason
        self.detail = detail
    }

    public var description: String { "\(reason.rawValue): \(detail)" }
}
