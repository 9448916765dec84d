import ThaliBeacons

/// What a `/NotificationBeacons` body looks like under each beacon profile, judged without any key:
/// the length formula, the ephemeral key's encoding and curve membership, the expiration window and
/// the beacon count. Beacon flags cannot be checked here: that needs a receiver's private key.
///
/// The two profiles' lengths (96 + 48·N and 73 + 48·N) never coincide, so a body fits at most one.
public struct BeaconBodyAnalysis: Sendable, Hashable {
    /// How a body fares under one profile.
    public struct ProfileFinding: Sendable, Hashable {
        /// The profile judged.
        public var profile: BeaconProfile
        /// Beacons the length implies (nil when the length does not fit the profile).
        public var beaconCount: Int?
        /// Why the body's shape does not fit the profile (nil: length and key fit).
        public var formatProblem: String?
        /// The expiration in milliseconds since the epoch, when the shape fits.
        public var expiration: UInt64?

        /// Whether length and key fit this profile.
        public var fits: Bool { formatProblem == nil }
    }

    /// The body's length in bytes.
    public let length: Int
    /// One finding per profile, `spec` first.
    public let findings: [ProfileFinding]

    /// Judges `body` under both profiles.
    public init(body: [UInt8]) {
        length = body.count
        findings = BeaconProfile.allCases.map { Self.judge(body, as: $0) }
    }

    /// The findings whose length and key fit.
    public var fitting: [ProfileFinding] { findings.filter(\.fits) }

    private static func judge(_ body: [UInt8], as profile: BeaconProfile) -> ProfileFinding {
        var finding = ProfileFinding(profile: profile)
        let remainder = body.count - profile.preambleLength
        guard remainder >= BeaconWire.beaconLength, remainder % BeaconWire.beaconLength == 0 else {
            finding.formatProblem = "length \(body.count) is not \(profile.preambleLength) + 48·N with N ≥ 1"
            return finding
        }
        let key = body[..<profile.ephemeralKeyLength]
        do {
            switch profile {
            case .spec: _ = try PublicKey(subjectPublicKeyInfo: key)
            case .cordova:
                guard key.first == 0x04 else {
                    finding.formatProblem = "the 65-byte key does not start with 04 (uncompressed point)"
                    return finding
                }
                _ = try PublicKey(sec1: key)
            }
        } catch {
            finding.formatProblem = "ephemeral key rejected (\(error))"
            return finding
        }
        finding.beaconCount = remainder / BeaconWire.beaconLength
        finding.expiration = body[profile.ephemeralKeyLength..<profile.preambleLength]
            .reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        return finding
    }
}

extension BeaconBodyAnalysis {
    /// Why `expiration` is outside what a receiver accepts at `now` (nil: inside): not in the past, and
    /// at most `BeaconWire.maximumFutureMilliseconds` ahead, each with `tolerance` for clock skew.
    public static func expirationProblem(_ expiration: UInt64, now: UInt64, tolerance: UInt64 = 0) -> String? {
        if expiration &+ tolerance < now {
            return "expired \(Self.duration(now - expiration)) ago"
        }
        let latest = now &+ BeaconWire.maximumFutureMilliseconds &+ tolerance
        if expiration > latest {
            return "expires in \(Self.duration(expiration - now)), more than 24 h ahead"
        }
        return nil
    }

    /// `1h02m03.456s`-style text for a span of milliseconds.
    static func duration(_ milliseconds: UInt64) -> String {
        let hours = milliseconds / 3_600_000, minutes = milliseconds / 60_000 % 60
        let seconds = Double(milliseconds % 60_000) / 1000
        if hours > 0 { return "\(hours)h\(minutes)m" }
        if minutes > 0 { return "\(minutes)m\(Int(seconds))s" }
        return "\(seconds)s"
    }
}
