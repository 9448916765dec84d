import ArgumentParser
import Foundation
import ThaliBeacons

/// `thali-node bench beacons [--json]`: medians of the beacon layer's costs in the `spec` profile.
struct BenchBeacons: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "beacons",
        abstract: "Measure beacon generation and parsing (spec profile by default; build with -c release).",
        discussion: """
            Medians in microseconds over --runs runs: generating 20 beacons with the Sxy cache cold \
            and warm; parsing a 20-beacon announcement whose last beacon is ours against a \
            10,000-contact address book; parsing one with no beacon for us; one ECDH; and warm \
            generation in ECDH (generate20_warm_ecdh), each run timed beside one ECDH.
            """)

    @Flag(help: "Print one JSON object instead of a table.")
    var json = false

    @Option(help: "Runs per measurement (at least 200).")
    var runs = 300

    @Option(help: "Contacts in the receiver's address book.")
    var contacts = 10_000

    @Option(help: "Wire profile: spec or cordova.")
    var profile = "spec"

    func validate() throws {
        guard runs >= 200 else { throw ValidationError("--runs must be at least 200") }
        guard contacts >= 1 else { throw ValidationError("--contacts must be at least 1") }
        guard BeaconProfile(rawValue: profile) != nil else { throw ValidationError("--profile must be spec or cordova") }
    }

    func run() throws {
        let profile = BeaconProfile(rawValue: self.profile) ?? .spec
        let sender = PrivateKey()
        let me = PrivateKey()
        let receivers = (0..<19).map { _ in PrivateKey().publicKey }
        let meLast = receivers + [me.publicKey]  // built once: the timings are of generation alone

        let generateCold = try median(runs) { () throws in
            let generator = BeaconGenerator(identity: sender, profile: profile)
            return try measure { _ = try generator.makeAnnouncement(for: meLast, validity: .seconds(3600)) }
        }
        let warmGenerator = BeaconGenerator(identity: sender, profile: profile)
        _ = try warmGenerator.makeAnnouncement(for: meLast, validity: .seconds(3600))
        let generateWarm = try median(runs) { () throws in
            try measure { _ = try warmGenerator.makeAnnouncement(for: meLast, validity: .seconds(3600)) }
        }

        // Fresh announcements for every parse: the replay cache would refuse a repeat.
        let limits = BeaconLimits(addressBookCapacity: contacts + 1, replayCacheCapacity: 2 * runs + 16)
        let receiver = BeaconReceiver(identity: me, profile: profile, limits: limits)
        for _ in 0..<(contacts - 1) { try receiver.addressBook.add(PrivateKey().publicKey) }
        try receiver.addressBook.add(sender.publicKey)
        let matching = try (0...runs).map { _ in try warmGenerator.makeAnnouncement(for: meLast, validity: .seconds(3600)) }
        _ = try receiver.receive(matching[runs].stream)  // caches Sxy, as for any known contact
        var next = 0
        let parseMatch = try median(runs) { () throws in
            defer { next += 1 }
            let stream = matching[next].stream
            return try measure {
                let match = try receiver.receive(stream)
                guard match.beaconIndex == 19 else { throw ValidationError("expected a match at beacon 19") }
            }
        }
        let strangers = try (0..<runs).map { _ in
            try warmGenerator.makeAnnouncement(for: receivers + [PrivateKey().publicKey], validity: .seconds(3600))
        }
        next = 0
        let parseNoMatch = try median(runs) { () throws in
            defer { next += 1 }
            let stream = strangers[next].stream
            return measure {
                do throws(BeaconRejection) { _ = try receiver.receive(stream) } catch { precondition(error.reason == .noMatch, "\(error)") }
            }
        }
        let ecdh = try median(runs) { () throws in measure { _ = me.sharedSecret(with: sender.publicKey) } }
        // Warm generation in ECDH: each run times one generation beside one ECDH, so that both see the
        // machine at the same speed. A VM's speed drifts between the phases above by up to half, and the
        // ratio of their medians with it.
        let generateWarmInECDH = try median(runs) { () throws in
            let generation = try measure { _ = try warmGenerator.makeAnnouncement(for: meLast, validity: .seconds(3600)) }
            return generation / measure { _ = me.sharedSecret(with: sender.publicKey) }
        }

        if json {
            let fields = [
                ("generate20_cold_us", generateCold), ("generate20_warm_us", generateWarm),
                ("parse20_match_last_us", parseMatch), ("parse20_no_match_us", parseNoMatch), ("ecdh_us", ecdh),
            ]
            print("{" + fields.map { "\"\($0.0)\": \(String(format: "%.1f", $0.1))" }.joined(separator: ", ")
                  + ", \"generate20_warm_ecdh\": \(String(format: "%.2f", generateWarmInECDH))}")
        } else {
            print("beacons, \(profile) profile, medians over \(runs) runs, \(contacts) contacts")
            for (name, value) in [
                ("generate 20 beacons, Sxy cache cold", generateCold), ("generate 20 beacons, Sxy cache warm", generateWarm),
                ("parse 20 beacons, ours last", parseMatch), ("parse 20 beacons, none ours", parseNoMatch), ("one ECDH", ecdh),
            ] {
                print("  \(name.padding(toLength: 38, withPad: " ", startingAt: 0)) \(String(format: "%9.1f", value)) us")
            }
            print("  \("generate 20 beacons, warm, in ECDH".padding(toLength: 38, withPad: " ", startingAt: 0)) \(String(format: "%9.2f", generateWarmInECDH))  (each run beside one ECDH)")
        }
    }

    /// Microseconds taken by `body`.
    private func measure(_ body: () throws -> Void) rethrows -> Double {
        let start = ContinuousClock.now
        try body()
        let elapsed = ContinuousClock.now - start
        let (seconds, attoseconds) = elapsed.components
        return Double(seconds) * 1e6 + Double(attoseconds) / 1e12
    }

    /// The median of `runs` samples.
    private func median(_ runs: Int, _ sample: () throws -> Double) rethrows -> Double {
        var samples: [Double] = []
        samples.reserveCapacity(runs)
        for _ in 0..<runs { samples.append(try sample()) }
        samples.sort()
        return runs % 2 == 1 ? samples[runs / 2] : (samples[runs / 2 - 1] + samples[runs / 2]) / 2
    }
}
