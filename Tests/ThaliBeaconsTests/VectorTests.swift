import Foundation
import Testing
import ThaliBeacons
import ThaliSupport
import ThaliTestSupport

/// Every case of the package's conformance vectors: generation byte for byte, PSK identities and
/// secrets, and every parse outcome (checked through `BeaconConformance`, which also backs the
/// `thali-node conformance beacons` command).
@Suite struct VectorTests {
    static let specPath = PackagePaths.root() + "/spec/vectors/beacons-spec.json"
    static let cordovaPath = PackagePaths.root() + "/spec/vectors/beacons-cordova.json"

    static func load(_ path: String) -> BeaconConformance.VectorFile? {
        // A missing or broken file fails `filesDeclareTheirFormatAndProfile` and leaves no cases.
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return try? JSONDecoder().decode(BeaconConformance.VectorFile.self, from: data)
    }

    static let specFile = load(specPath)
    static let cordovaFile = load(cordovaPath)
    static let specCases = specFile?.cases ?? []
    static let cordovaCases = cordovaFile?.cases ?? []

    @Test func filesDeclareTheirFormatAndProfile() {
        #expect(Self.specFile?.format == BeaconConformance.format)
        #expect(Self.specFile?.profile == "spec")
        #expect(Self.specCases.count == 10)
        #expect(Self.cordovaFile?.format == BeaconConformance.format)
        #expect(Self.cordovaFile?.profile == "cordova")
        #expect(Self.cordovaCases.count == 16)
    }

    @Test(arguments: specCases.map(\.id))
    func specCase(_ id: String) throws {
        let vector = try #require(Self.specCases.first { $0.id == id })
        let differences = BeaconConformance.check(vector, profile: .spec, file: "beacons-spec.json")
        #expect(differences.isEmpty, "\(differences.map(\.description).joined(separator: "\n"))")
    }

    @Test(arguments: cordovaCases.map(\.id))
    func cordovaCase(_ id: String) throws {
        let vector = try #require(Self.cordovaCases.first { $0.id == id })
        let differences = BeaconConformance.check(vector, profile: .cordova, file: "beacons-cordova.json")
        #expect(differences.isEmpty, "\(differences.map(\.description).joined(separator: "\n"))")
    }

    /// The same cases, exercised directly through the public API rather than the checker: the
    /// generated stream and PSKs, and each parse's outcome.
    @Test(arguments: [BeaconProfile.spec, .cordova])
    func publicAPIReproducesEveryCase(_ profile: BeaconProfile) throws {
        let cases = profile == .spec ? Self.specCases : Self.cordovaCases
        #expect(!cases.isEmpty)
        var parses = 0
        for vector in cases {
            let generator = BeaconGenerator(identity: try PrivateKey(hex: vector.senderPrivateKey), profile: profile)
            let announcement = try generator.makeAnnouncement(
                for: try vector.receiverPublicKeys.map { try PublicKey(hex: $0) },
                expiration: vector.expirationMilliseconds,
                ephemeralKey: try PrivateKey(hex: vector.ephemeralPrivateKey))
            #expect(Hex.encode(announcement.stream) == vector.stream.lowercased(), "\(vector.id)")
            #expect(announcement.expiration == vector.expirationMilliseconds)
            #expect(announcement.beacons.map(\.pskIdentity) == vector.beacons.map(\.pskIdentity), "\(vector.id)")
            #expect(announcement.beacons.map { Hex.encode($0.psk) } == vector.beacons.map { $0.pskSecret.lowercased() }, "\(vector.id)")
            #expect(announcement.beacons.map(\.receiver) == (try vector.receiverPublicKeys.map { try PublicKey(hex: $0) }))

            for parse in vector.parses {
                let receiver = BeaconReceiver(identity: try PrivateKey(hex: parse.receiverPrivateKey), profile: profile)
                try receiver.addressBook.add(contentsOf: try parse.addressBook.map { try PublicKey(hex: $0) })
                let stream = try #require(Hex.decode(parse.stream ?? vector.stream))
                let result = Result { () throws(BeaconRejection) in try receiver.receive(stream, now: parse.nowMilliseconds) }
                switch result {
                case .success(let match):
                    #expect(match.beaconIndex == parse.expect.match, "\(vector.id) \(parse.description ?? "")")
                    #expect(match.sender == (try PublicKey(hex: try #require(parse.expect.senderPublicKey))))
                    #expect(match.pskIdentity == vector.beacons[match.beaconIndex].pskIdentity)
                    #expect(match.expiration == vector.expirationMilliseconds)
                case .failure(let rejection):
                    #expect(rejection.reason.rawValue == parse.expect.reject, "\(vector.id) \(parse.description ?? ""): \(rejection)")
                }
                parses += 1
            }
        }
        #expect(parses == (profile == .spec ? 28 : 41))
    }

    @Test func wholeFilesPassThroughTheChecker() {
        var report = BeaconConformance.check(contentsOf: Self.specPath)
        report.merge(BeaconConformance.check(contentsOf: Self.cordovaPath))
        #expect(report.differences.isEmpty, "\(report.differences)")
        #expect(report.passed == 26)
        #expect(report.failed == 0)
    }
}
