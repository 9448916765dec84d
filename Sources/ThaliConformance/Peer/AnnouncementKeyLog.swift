import Crypto
import ThaliBeacons
import ThaliSSDP
import ThaliSupport

/// The announcements the suite fetched during a run, by location: for each distinct stream, its
/// ephemeral key, so that a key drawn once and used again shows [BCN-1.3]. A stream fetched again
/// (the same bytes under another USN, as a node serving several announcements in turn does) is the same
/// announcement, not a reuse.
struct AnnouncementKeyLog: Sendable {
    /// Most distinct streams kept per location: a run sees a few dozen at most.
    static let maxStreamsPerLocation = 256
    /// Most locations kept: every peer on the segment is fetched, and a crowded or hostile one must not
    /// grow the log; a location first heard beyond this is not judged (N/A).
    static let maxLocations = 256

    private struct Entry: Sendable {
        var key: [UInt8]
        var digest: [UInt8]
    }

    let profile: BeaconProfile
    private var streams: [BeaconLocation: [Entry]] = [:]

    init(profile: BeaconProfile) { self.profile = profile }

    /// Keeps `stream`, fetched from `location`, if it is a new one (anything shorter than a preamble and
    /// a beacon, a 204's empty body say, is not an announcement).
    mutating func record(_ stream: [UInt8], from location: BeaconLocation) {
        guard stream.count >= profile.streamLength(beaconCount: 1) else { return }
        let digest = Array(SHA256.hash(data: stream))
        guard streams[location] != nil || streams.count < Self.maxLocations else { return }
        var entries = streams[location] ?? []
        guard entries.count < Self.maxStreamsPerLocation, !entries.contains(where: { $0.digest == digest }) else { return }
        entries.append(Entry(key: Array(stream.prefix(profile.ephemeralKeyLength)), digest: digest))
        streams[location] = entries
    }

    /// The judgement of the announcements from `location`: nil when fewer than two were fetched (nothing to
    /// compare); otherwise whether every one carries a key no other one does, and what was seen.
    func judge(_ location: BeaconLocation) -> (holds: Bool, actual: String)? {
        let entries = streams[location] ?? []
        guard entries.count >= 2 else { return nil }
        var seen: Set<[UInt8]> = []
        for entry in entries where !seen.insert(entry.key).inserted {
            return (false, "\(entries.count) announcements, the ephemeral key \(Hex.encode(entry.key.prefix(8)))… in more than one")
        }
        return (true, "\(entries.count) announcements, \(entries.count) different ephemeral keys")
    }

    /// How many distinct announcements came from `location`.
    func count(_ location: BeaconLocation) -> Int { streams[location]?.count ?? 0 }
}
