import Foundation
import ThaliBeacons
import ThaliNodeCore

/// The identity key file (PEM around an SEC 1 / RFC 5915 EC private key DER).
///
/// Invariant: a key that parses is written back (PEM) to a file that parses to the same key.
enum IdentityKeyFileHarness {
    static let name = "identity-key-file"

    static let harness = FuzzHarness(name: name, summary: "identity.pem as the node reads it", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let text = String(decoding: input.rest(), as: UTF8.self)
        guard let key = try? IdentityKeyFile.parse(pem: text) else { return }
        let again = try? IdentityKeyFile.parse(pem: IdentityKeyFile.pemEncoding(of: key))
        try check(again?.rawRepresentation == key.rawRepresentation, name, "the key does not survive writing back")
    }

    static func seeds() -> [[UInt8]] {
        [Array(IdentityKeyFile.pemEncoding(of: fixedKey(0x11)).utf8), Array(IdentityKeyFile.pemEncoding(of: fixedKey(0x7E)).utf8)]
    }
}

/// `config.json` through the node's parser, including the line-and-column locator for syntax errors.
///
/// Invariants: every failure is a `ConfigurationError`; a configuration that parses, written out as the
/// JSON object `config show` prints, parses to the same configuration.
enum NodeConfigurationHarness {
    static let name = "node-config"

    static let harness = FuzzHarness(name: name, summary: "config.json and its error locations", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let bytes = input.rest()
        let data = Data(bytes)
        if let error = JSONSyntaxLocator.firstError(in: bytes) {
            try check(error.offset <= bytes.count && error.line >= 1 && error.column >= 1 && error.column <= error.offset + 1,
                      name, "a syntax error placed outside the text: \(error) of \(bytes.count) bytes")
        }
        let configuration: NodeConfiguration
        do {
            configuration = try NodeConfiguration.parse(data, path: "config.json")
        } catch {
            try check(error is ConfigurationError, name, "untyped error \(type(of: error)): \(error)")
            return
        }
        do {
            var object = configuration.jsonObject
            if configuration.interface == nil { object["interface"] = nil }
            let written = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            let again = try NodeConfiguration.parse(written, path: "config.json")
            try check(again == configuration, name, "the configuration does not survive `config show`")
        } catch let violation as FuzzInvariantViolation {
            throw violation
        } catch {
            throw FuzzInvariantViolation(harness: name, detail: "what `config show` prints does not parse: \(error)")
        }
    }

    static func seeds() -> [[UInt8]] {
        [
            #"{"interface": "eth0", "deliveryPort": 4242, "beaconProfile": "cordova", "dhGroup": "ffdhe3072"}"#,
            "{\n  \"maxItemBytes\": 1048576,\n  \"logLevel\": \"debug\",\n  \"chunkBytes\": 4096\n}\n",
            "{\n  \"deliveryPort\": 70000\n}",
            "{\n  \"ssdpPort\": 1900,\n  \"beaconValiditySeconds\": 60,",
        ].map { Array($0.utf8) }
    }
}

/// The conformance vector format (`spec/vectors/*.json`), as `thali-node conformance beacons` reads it.
///
/// Invariant: the report is consistent: every failed case has at least one difference, and a report
/// without failures has none.
enum ConformanceVectorHarness {
    static let name = "conformance-vectors"

    static let harness = FuzzHarness(name: name, summary: "beacon conformance vector files", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let report = BeaconConformance.check(json: Data(input.rest()), file: "vectors.json")
        try check((report.failed == 0) == report.differences.isEmpty, name,
                  "\(report.failed) failed cases with \(report.differences.count) differences")
    }

    /// The first case of each committed vector file, in its own file.
    static func seeds() -> [[UInt8]] {
        var seeds: [[UInt8]] = []
        for profile in ["spec", "cordova"] {
            // The package root, from this file's place in Sources/ThaliFuzzHarnesses.
            let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            let path = root.appendingPathComponent("spec/vectors/beacons-\(profile).json").path
            guard let data = FileManager.default.contents(atPath: path),
                  var object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any],
                  let cases = object["cases"] as? [Any], let first = cases.first
            else { continue }
            object["cases"] = [first]
            if let bytes = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) { seeds.append(Array(bytes)) }
        }
        return seeds
    }
}
