// swift-tools-version:6.0
import PackageDescription

/// The Thali discovery and connectivity suite. Every library module is usable on its own; C libraries
/// come in through thin system-library targets and are wrapped by Swift classes that own their pointers.
let package = Package(
    name: "thali-swift",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "ThaliSupport", targets: ["ThaliSupport"]),
        .library(name: "ThaliAdmission", targets: ["ThaliAdmission"]),
        .library(name: "ThaliBeacons", targets: ["ThaliBeacons"]),
        .library(name: "ThaliPSKTLS", targets: ["ThaliPSKTLS"]),
        .library(name: "ThaliSSDP", targets: ["ThaliSSDP"]),
        .library(name: "TCPMultiplexer", targets: ["TCPMultiplexer"]),
        .library(name: "ThaliBLEBinding", targets: ["ThaliBLEBinding"]),
        .library(name: "ThaliConformance", targets: ["ThaliConformance"]),
        .library(name: "ThaliNodeCore", targets: ["ThaliNodeCore"]),
        .library(name: "ThaliNodeBluetooth", targets: ["ThaliNodeBluetooth"]),
        .executable(name: "thali-node", targets: ["thali-node"]),
        /// The fuzz harnesses' entry points, for the `Fuzz/` package; not an API for applications.
        .library(name: "ThaliFuzzHarnesses", targets: ["ThaliFuzzHarnesses"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "3.12.3"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        // Documentation only (`swift package generate-documentation`); adds nothing to the products.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin.git", from: "1.5.0"),
    ],
    targets: [
        // MARK: C libraries (module map + pkg-config; static inline shims only where the C API uses macros)
        .systemLibrary(
            name: "CSecp256k1", path: "Sources/CSecp256k1", pkgConfig: "libsecp256k1",
            providers: [.apt(["libsecp256k1-dev"])]),
        .systemLibrary(
            name: "COpenSSL", path: "Sources/COpenSSL", pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]),
        .systemLibrary(
            name: "CDBus", path: "Sources/CDBus", pkgConfig: "dbus-1",
            providers: [.apt(["libdbus-1-dev"])]),
        .systemLibrary(
            name: "CBluetooth", path: "Sources/CBluetooth", pkgConfig: "bluez",
            providers: [.apt(["libbluetooth-dev"])]),

        // MARK: Library modules
        /// Deliberate faults for grading the conformance suite, active only in debug builds (`THALI_MUTANT`).
        .target(name: "ThaliMutants"),
        /// The general helpers every module shares, with no NIO: the hex codec (`Hex`), base64 encoding
        /// (`Base64`), a mutex around a value (`Locked`) and the jittered exponential backoff (`Backoff`).
        .target(name: "ThaliSupport"),
        /// Admission of incoming connections (per source before global), shared by every listener.
        .target(
            name: "ThaliAdmission",
            dependencies: [
                "ThaliSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]),
        .target(
            name: "ThaliBeacons",
            dependencies: [
                "CSecp256k1", "COpenSSL", "ThaliMutants", "ThaliSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
            ]),
        .target(
            name: "ThaliPSKTLS",
            dependencies: [
                "COpenSSL", "ThaliAdmission", "ThaliMutants",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        .target(
            name: "ThaliSSDP",
            dependencies: [
                "ThaliAdmission", "ThaliMutants", "ThaliSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        .target(
            name: "TCPMultiplexer",
            dependencies: [
                "ThaliMutants",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        /// The Bluetooth device address, without C libraries: what ThaliNodeCore names a Bluetooth peer by
        /// without linking D-Bus or BlueZ. ThaliBLEBinding and ThaliNodeCore re-export it.
        .target(name: "ThaliBluetoothAddress"),
        .target(
            name: "ThaliBLEBinding",
            dependencies: [
                "CDBus", "CBluetooth", "TCPMultiplexer", "ThaliAdmission", "ThaliBluetoothAddress", "ThaliMutants",
                "ThaliSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        .target(
            name: "ThaliConformance",
            dependencies: [
                "ThaliBeacons", "ThaliSSDP", "ThaliPSKTLS", "TCPMultiplexer", "ThaliNodeCore", "ThaliBLEBinding",
                "ThaliSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]),
        /// The peer as a library (`ThaliPeer`) with its Wi-Fi (SSDP) binding and the interface other bindings
        /// implement (`PeerBindingService`, `PeerBindingFactory`); the node's data directory, configuration,
        /// SQLite store (GRDB), and the store-and-forward delivery protocol that runs over any authenticated
        /// byte stream. Links neither D-Bus nor BlueZ: Bluetooth is ThaliNodeBluetooth.
        .target(
            name: "ThaliNodeCore",
            dependencies: [
                "ThaliAdmission", "ThaliBeacons", "ThaliMutants", "ThaliSSDP", "ThaliPSKTLS", "TCPMultiplexer", "ThaliBluetoothAddress",
                "ThaliSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]),
        /// The peer's Bluetooth binding (BLE discovery and advertising through BlueZ, the RFCOMM relay and
        /// multiplexer; `BluetoothPeerConfiguration`, set as `PeerConfiguration.bluetooth`): for apps whose
        /// peer uses Bluetooth, which then link D-Bus and BlueZ.
        .target(
            name: "ThaliNodeBluetooth",
            dependencies: [
                "ThaliNodeCore", "ThaliBLEBinding", "ThaliSSDP", "TCPMultiplexer", "ThaliSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        /// `thali-node bench`: the benchmarks of every layer (beacons, SSDP, the multiplexer, PSK-TLS, the
        /// Bluetooth relay, delivery) and of whole peers (crowd, hall, flood, relay), apart from the CLI's
        /// commands; the CLI runs them. Not an API for applications.
        .target(
            name: "ThaliNodeBenchmarks",
            dependencies: [
                "ThaliAdmission", "ThaliBeacons", "ThaliPSKTLS", "ThaliSSDP", "TCPMultiplexer", "ThaliBLEBinding",
                "ThaliNodeCore", "ThaliProcess", "ThaliNetLab",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]),
        /// The command-line peer: identity, contacts, send, run, the demo and the conformance tools; its
        /// `bench` command is ThaliNodeBenchmarks.
        .executableTarget(
            name: "thali-node",
            dependencies: [
                "ThaliAdmission", "ThaliBeacons", "ThaliPSKTLS", "ThaliSSDP", "TCPMultiplexer", "ThaliBLEBinding",
                "ThaliConformance", "ThaliNodeCore", "ThaliNodeBluetooth", "ThaliNodeBenchmarks", "ThaliProcess",
                "ThaliSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            plugins: ["BuildCommit"]),
        /// Bakes the git commit into `thali-node --version` (`BuildCommit.hash`): SwiftPM has no build-time
        /// defines, so a build command, rerun whenever the checkout changes, writes a small Swift file.
        .plugin(name: "BuildCommit", capability: .buildTool()),

        // MARK: Examples (built and run by the tests so they cannot rot; each uses one module as an app would)
        .executableTarget(name: "beacon-round-trip", dependencies: ["ThaliBeacons"], path: "Examples/BeaconRoundTrip"),
        .executableTarget(
            name: "psk-tls-echo",
            dependencies: [
                "ThaliPSKTLS",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Examples/PSKTLSEcho"),
        .executableTarget(
            name: "yamux-bridge",
            dependencies: [
                "TCPMultiplexer",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Examples/YamuxBridge"),
        .executableTarget(
            name: "embedded-peer",
            dependencies: [
                "ThaliNodeCore",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Examples/EmbeddedPeer"),

        /// One entry point per input surface, shared by libFuzzer (`Fuzz/`, built with sanitizers) and the
        /// corpus replay in `ThaliFuzzHarnessesTests`, so that every committed input runs in CI.
        .target(
            name: "ThaliFuzzHarnesses",
            dependencies: [
                "ThaliBeacons", "ThaliSSDP", "ThaliPSKTLS", "TCPMultiplexer", "ThaliBLEBinding", "ThaliNodeCore",
                "ThaliConformance", "ThaliNetLab",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]),

        /// The TAP ioctl, ppoll with a nanosecond timeout, setns and the timer slack, for ThaliNetLab: Glibc
        /// imports neither `TUNSETIFF` (a macro) nor the TUN flags.
        .target(name: "CNetLabTap"),
        /// The lab of real-looking links (issue 38): hosts in network namespaces joined by a user-space wire
        /// over TAP devices that adds delay, jitter, loss, multicast loss, a rate and flaps (`NetLab`,
        /// `WireStage`), with its scheduler sans I/O (`LinkDirection`, `FlapSchedule`). A test and
        /// benchmark fixture (`thali-node bench netlab`, `bench links`), not an API for applications.
        .target(name: "ThaliNetLab", dependencies: ["CNetLabTap", "ThaliProcess", "ThaliSupport"]),

        /// Child processes started with posix_spawn, inheriting no descriptor beyond 0–2 and killed and
        /// reaped on every exit path: the CLI's demo and benchmark peers, and the tests' independent peers.
        .target(name: "ThaliProcess"),

        // MARK: Tests (mirror Sources/<Module>)
        /// Helpers every test target may share, on the low-level modules only: child processes of independent
        /// peers (``ThaliProcess``, re-exported), package paths, the test environment, TCP connects from a
        /// chosen source address, a seeded random generator, snake_case JSON keys.
        .target(
            name: "ThaliTestSupport",
            dependencies: ["ThaliProcess", "ThaliSupport", .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio")]),
        /// Helpers for the tests of the peer and of what drives it (ThaliTestSupport re-exported): `Node/`:
        /// data directories and people with identities and contacts, a loopback peer, an announcement copied to
        /// another port; `Beacons/`: a deliberately broken beacon server. Links ThaliNodeCore, so only the
        /// test targets that test the peer, the CLI or the conformance suite use it.
        .target(
            name: "ThaliNodeTestSupport",
            dependencies: [
                "ThaliTestSupport", "ThaliBeacons", "ThaliSSDP", "ThaliNodeCore", "ThaliSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        /// The python-dbusmock BlueZ stand-in (ThaliTestSupport re-exported), for the test targets that run
        /// Bluetooth over it; links ThaliBLEBinding but not the peer.
        .target(
            name: "ThaliBluetoothTestSupport",
            dependencies: ["ThaliTestSupport", "ThaliBLEBinding"]),
        .testTarget(
            name: "ThaliSupportTests",
            dependencies: ["ThaliSupport", "ThaliTestSupport"]),
        .testTarget(name: "ThaliBeaconsTests", dependencies: ["ThaliBeacons", "ThaliSupport", "ThaliTestSupport"]),
        .testTarget(
            name: "ThaliAdmissionTests",
            dependencies: [
                "ThaliAdmission", "ThaliTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]),
        .testTarget(
            name: "ThaliPSKTLSTests",
            dependencies: [
                "ThaliPSKTLS", "ThaliAdmission", "ThaliBeacons", "ThaliTestSupport",
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]),
        .testTarget(
            name: "ThaliSSDPTests",
            dependencies: [
                "ThaliSSDP", "ThaliBeacons", "ThaliTestSupport",
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            exclude: ["Reference"]),
        .testTarget(
            name: "TCPMultiplexerTests",
            dependencies: [
                "TCPMultiplexer", "ThaliTestSupport",
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            exclude: ["Reference", "GoPeer"]),
        .testTarget(
            name: "ThaliConformanceTests",
            dependencies: [
                "ThaliConformance", "ThaliSSDP", "ThaliBeacons", "ThaliNodeTestSupport", "ThaliPSKTLS", "ThaliSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]),
        .testTarget(
            name: "ThaliBLEBindingTests",
            dependencies: [
                "ThaliBLEBinding", "ThaliBluetoothTestSupport", "ThaliBeacons", "ThaliSSDP", "TCPMultiplexer", "ThaliPSKTLS",
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]),
        .testTarget(
            name: "ThaliNodeCoreTests",
            dependencies: [
                "ThaliNodeCore", "ThaliNodeBluetooth", "ThaliBeacons", "TCPMultiplexer", "ThaliPSKTLS", "ThaliSSDP", "ThaliNodeTestSupport",
                "ThaliSupport",
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]),
        /// The Bluetooth peer binding: its pursuit state machine, and peers over the BlueZ mock.
        .testTarget(
            name: "ThaliNodeBluetoothTests",
            dependencies: [
                "ThaliNodeBluetooth", "ThaliNodeCore", "ThaliBLEBinding", "ThaliSupport", "ThaliBeacons", "ThaliSSDP",
                "ThaliBluetoothTestSupport", "ThaliNodeTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        /// `thali-node` (Sources/thali-node, with its `bench` commands from ThaliNodeBenchmarks) as a user
        /// runs it: the built binary as a separate process, its output, exit status and data directory;
        /// several processes on loopback, over the BlueZ mock, in network namespaces and in a QEMU guest.
        .testTarget(
            name: "ThaliNodeCLITests",
            dependencies: [
                "ThaliNodeCore", "ThaliBLEBinding", "ThaliBeacons", "ThaliSSDP", "ThaliPSKTLS", "ThaliConformance",
                "ThaliProcess", "ThaliNodeTestSupport", "ThaliBluetoothTestSupport", "ThaliNetLab",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]),
        /// The lab's scheduler on a virtual clock, and its wire between two real network namespaces.
        .testTarget(name: "ThaliNetLabTests", dependencies: ["ThaliNetLab", "ThaliSupport", "ThaliTestSupport"]),
        /// Replays every committed fuzz corpus file (`Fuzz/Corpus/<harness>/`) through its harness.
        .testTarget(name: "ThaliFuzzHarnessesTests", dependencies: ["ThaliFuzzHarnesses", "ThaliTestSupport"]),
        /// Runs the examples (`Examples/`) as an app author would and checks what they print.
        .testTarget(name: "ExamplesTests", dependencies: ["ThaliTestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
