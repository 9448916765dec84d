import ArgumentParser
import Foundation
import ThaliBeacons

/// `thali-node demo`: the README's first command. Three people (Alice, Bob, Carol) and a stranger
/// (Mallory) exchange notification beacons: Alice advertises for Bob and Carol; each receiver learns
/// whether a beacon is for it and from whom, and derives the same PSK identity and secret as Alice's
/// TLS server would accept. Nothing here reveals Alice's identity to Mallory.
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a self-contained demonstration of private discovery with notification beacons.")

    @Option(help: "Beacon wire profile: spec or cordova.")
    var profile: String = "spec"

    func run() async throws {
        guard let profile = BeaconProfile(rawValue: profile) else {
            throw ValidationError("unknown profile '\(profile)' (spec or cordova)")
        }
        var steps: [(String, Duration)] = []
        let clock = ContinuousClock()
        func step<T, E: Error>(_ name: String, _ body: () throws(E) -> T) throws(E) -> T {
            let start = clock.now
            let value = try body()
            steps.append((name, clock.now - start))
            return value
        }

        print("Thali beacon demo (profile \(profile.rawValue))\n")
        let names = ["Alice", "Bob", "Carol", "Mallory"]
        let keys = step("create 4 identities") { names.map { _ in PrivateKey() } }
        for (name, key) in zip(names, keys) {
            print("  \(name.padding(toLength: 8, withPad: " ", startingAt: 0)) public key \(key.publicKey.hexString(compressed: true))")
        }
        let (alice, bob, carol, mallory) = (keys[0], keys[1], keys[2], keys[3])

        let generator = BeaconGenerator(identity: alice, profile: profile)
        let announcement = try step("Alice: generate beacons for Bob and Carol") { () throws(BeaconGenerationError) in
            try generator.makeAnnouncement(for: [bob.publicKey, carol.publicKey], validity: .seconds(600))
        }
        let table = AdvertisedPSKTable()
        table.register(announcement)
        print("\nAlice advertises \(announcement.stream.count) bytes: \(announcement.beacons.count) beacons, expiring at \(announcement.expiration) ms")

        var delivered = 0
        for (name, key, knowsAlice) in [("Bob", bob, true), ("Carol", carol, true), ("Mallory", mallory, false)] {
            let receiver = BeaconReceiver(identity: key, profile: profile)
            try receiver.addressBook.add(knowsAlice ? alice.publicKey : carol.publicKey)
            do throws(BeaconRejection) {
                let match = try step("\(name): parse the announcement") { () throws(BeaconRejection) in
                    try receiver.receive(announcement.stream)
                }
                let accepted = table.lookup(identity: match.pskIdentity)
                let agrees = accepted?.psk == match.psk && accepted?.contact == key.publicKey
                print("  \(name): beacon \(match.beaconIndex) is for me, from \(match.sender == alice.publicKey ? "Alice" : "?"); "
                      + "PSK identity \(match.pskIdentity.prefix(24))… (\(match.pskIdentity.count) chars); "
                      + "Alice's TLS server \(agrees ? "accepts it with the same PSK" : "REFUSES it")")
                if agrees { delivered += 1 }
                do throws(BeaconRejection) {
                    _ = try receiver.receive(announcement.stream)
                } catch {
                    print("  \(name): the same announcement again is rejected: \(error.reason.rawValue)")
                }
            } catch {
                print("  \(name): nothing for me (\(error.reason.rawValue)); I learn nothing about who advertised")
            }
        }

        print("\nSummary: \(delivered) of 2 intended receivers matched and agree on their PSK with Alice.")
        for (name, duration) in steps {
            let micros = Double(duration.components.attoseconds) / 1e12 + Double(duration.components.seconds) * 1e6
            print("  \(name.padding(toLength: 44, withPad: " ", startingAt: 0)) \(String(format: "%9.1f", micros)) µs")
        }
        if delivered != 2 { throw ExitCode.failure }
    }
}
