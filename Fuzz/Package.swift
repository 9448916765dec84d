// swift-tools-version:6.0
import PackageDescription

/// Coverage-guided fuzzing of every input surface of the suite, with libFuzzer. Built apart from the main
/// package so that sanitizer flags never touch it:
///
///     swift build -c release -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library
///
/// (`scripts/fuzz.sh` does this). One executable per harness; the harness bodies live in the main
/// package's `ThaliFuzzHarnesses` library, whose corpus replay runs in the tests.

/// Harness name (its corpus folder, `Fuzz/Corpus/<name>`) and executable target.
let harnesses: [(name: String, target: String)] = [
    ("beacon-stream", "FuzzBeaconStream"),
    ("ssdp-datagram", "FuzzSSDPDatagram"),
    ("beacon-http-response", "FuzzBeaconHTTPResponse"),
    ("beacon-http-request", "FuzzBeaconHTTPRequest"),
    ("yamux-session", "FuzzYamuxSession"),
    ("thali-multiplex-session", "FuzzThaliMultiplexSession"),
    ("yamux-pair", "FuzzYamuxPair"),
    ("thali-multiplex-pair", "FuzzThaliMultiplexPair"),
    ("delivery-frames", "FuzzDeliveryFrames"),
    ("delivery-pair", "FuzzDeliveryPair"),
    ("ble-advdata", "FuzzBLEAdvData"),
    ("bluetooth-handshake", "FuzzBluetoothHandshake"),
    ("dbus-message", "FuzzDBusMessage"),
    ("identity-key-file", "FuzzIdentityKeyFile"),
    ("node-config", "FuzzNodeConfig"),
    ("conformance-vectors", "FuzzConformanceVectors"),
    ("psk-tls-server", "FuzzPSKTLSServer"),
    ("psk-tls-pair", "FuzzPSKTLSPair"),
    ("tls-hello-flight", "FuzzTLSHelloFlight"),
    ("ssdp-search-answers", "FuzzSSDPSearchAnswers"),
    ("stream-header", "FuzzStreamHeader"),
    ("adapter-events", "FuzzAdapterEvents"),
    ("raw-yamux-input", "FuzzRawYamuxInput"),
    ("node-events", "FuzzNodeEvents"),
    ("ethernet-header", "FuzzEthernetHeader"),
]

let package = Package(
    name: "thali-fuzz",
    platforms: [.macOS(.v14)],
    dependencies: [.package(name: "thali-swift", path: "..")],
    targets: [
        /// libFuzzer's driver entry and the bridge from its callback to a harness.
        .target(name: "FuzzDriver", dependencies: [.product(name: "ThaliFuzzHarnesses", package: "thali-swift")]),
        /// Writes every harness's seeds into `Corpus/<name>/` (`scripts/fuzz.sh --seed`).
        .executableTarget(name: "FuzzSeeds", dependencies: ["FuzzDriver"]),
    ] + harnesses.map { .executableTarget(name: $0.target, dependencies: ["FuzzDriver"]) },
    swiftLanguageModes: [.v6]
)
