import NIOCore
import ThaliSSDP

extension TargetConformance.Cases {
    /// `target/ssdp/forgotten-after-max-age`: a peer that stopped announcing is forgotten once its
    /// max-age has passed, so its next alive, same USN and location, is fetched again.
    public static let forgotten = ConformanceCase("target/ssdp/forgotten-after-max-age",
                                                  "a fetched peer that goes silent for longer than its max-age (2 s) is forgotten: its next alive, same USN and location, is fetched again",
                                                  ["SSDP-4.4"])
}

/// The peer of `target/ssdp/forgotten-after-max-age` [SSDP-4.4]: one alive with a short max-age in the
/// script's first step, then silence through the second (two observation periods, far past the max-age),
/// then the same alive again; an implementation that forgot the peer fetches it anew, one that still
/// holds it fetches nothing (fetch-once-per-usn). It runs beside the other steps, so it costs the run
/// no time of its own.
struct ForgettingPeer {
    /// The max-age of its alives, in seconds: short, so that the silence spans it with room to spare.
    static let maxAgeSeconds = 2
    /// The least silence before it announces again: its max-age and then some (a receiver checks expiry
    /// periodically; ours every 100 ms).
    static let leastSilence: TimeAmount = .seconds(Int64(maxAgeSeconds) + 1)

    let location: ScriptedLocation
    let usn = ThaliServiceName.makeUniqueServiceName()
    private(set) var fetchesBeforeReturn = 0
    private(set) var firstSent: NIODeadline?
    private(set) var returned: NIODeadline?

    init(location: ScriptedLocation) { self.location = location }

    /// Announces it for the first time.
    mutating func announce(with sender: MulticastSender, _ datagrams: TargetDatagrams) async throws {
        firstSent = .now()
        try await sender.send(alive(datagrams))
    }

    private func alive(_ datagrams: TargetDatagrams) -> [UInt8] {
        datagrams.alive(usn: usn, location: location.url, maxAge: Self.maxAgeSeconds)
    }

    /// Announces it again after the silence (waiting for what is left of ``leastSilence``).
    mutating func announceAgain(with sender: MulticastSender, _ datagrams: TargetDatagrams) async throws {
        let left = (firstSent ?? .now()) + Self.leastSilence - .now()
        if left > .zero { try await Task.sleep(for: .nanoseconds(left.nanoseconds)) }
        fetchesBeforeReturn = location.fetches
        returned = .now()
        try await sender.send(alive(datagrams))
    }

    /// Grades it, once an observation period has passed since ``announceAgain(with:_:)`` (waiting for
    /// what is left of it).
    func grade(_ run: ConformanceRun, observation: TimeAmount) async throws {
        let testCase = TargetConformance.Cases.forgotten
        let expected = "a new fetch within \(PeerConformance.text(observation)) of its alive after the silence"
        guard let returned, fetchesBeforeReturn >= 1 else {
            run.record(testCase, .inconclusive, expected: expected, actual: "its first alive was not fetched")
            return
        }
        let left = returned + observation - .now()
        if left > .zero { try await Task.sleep(for: .nanoseconds(left.nanoseconds)) }
        let again = location.fetches - fetchesBeforeReturn
        run.grade(testCase, holds: again >= 1, expected: expected,
                  actual: again >= 1 ? "fetched again (\(again))" : "not fetched again: it still holds the peer", started: returned)
    }
}
