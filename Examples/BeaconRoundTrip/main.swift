// A beacon round trip, as an app's address book would use ThaliBeacons: Alice announces beacons for
// Bob and Carol; Bob, who knows Alice, finds the one meant for him and derives the same PSK that Alice's
// side will look up when Bob connects. Mallory, who is in nobody's address book, learns nothing.
import ThaliBeacons

let alice = PrivateKey()
let bob = PrivateKey()
let carol = PrivateKey()
let mallory = PrivateKey()

// Alice's side: one announcement for everyone she holds something for, and a table of the PSKs it
// promises, which her TLS server consults by PSK identity.
let generator = BeaconGenerator(identity: alice)
let announcement = try generator.makeAnnouncement(for: [carol.publicKey, bob.publicKey], validity: .seconds(600))
let advertised = AdvertisedPSKTable()
advertised.register(announcement)
print("alice announces \(announcement.beacons.count) beacons in \(announcement.stream.count) bytes")

// Bob's side: his address book holds Alice, so her beacon for him matches.
let bobsReceiver = BeaconReceiver(identity: bob)
try bobsReceiver.addressBook.add(alice.publicKey)
let match = try bobsReceiver.receive(announcement.stream)
guard match.sender == alice.publicKey else { fatalError("the beacon names the wrong sender") }
print("bob found beacon #\(match.beaconIndex) from alice; PSK identity \(match.pskIdentity)")

// What Alice's TLS server will find when Bob presents that identity: the same key, for Bob.
guard let entry = advertised.lookup(identity: match.pskIdentity), entry.psk == match.psk, entry.contact == bob.publicKey
else { fatalError("alice's table does not hold bob's PSK") }
print("alice's table holds the same \(entry.psk.count)-byte PSK for bob: true")

// A stranger: the stream is not for him, and the rejection says why without naming anyone.
let mallorysReceiver = BeaconReceiver(identity: mallory)
try mallorysReceiver.addressBook.add(alice.publicKey)
do {
    _ = try mallorysReceiver.receive(announcement.stream)
    fatalError("mallory matched a beacon that was not for him")
} catch {
    print("mallory: \(error.reason.rawValue)")
}
