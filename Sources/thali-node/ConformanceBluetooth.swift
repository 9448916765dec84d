import ArgumentParser
import Foundation
import NIOCore
import ThaliBLEBinding
import ThaliConformance

/// `thali-node conformance bluetooth`: grades another implementation's Bluetooth server over raw streams.
struct ConformanceBluetoothCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bluetooth",
        abstract: "Grade another implementation's Bluetooth server: the handshake, the surprise connection, the relay.",
        discussion: """
            Opens raw Bluetooth streams (RFCOMM) to the implementation's address and channel and grades its \
            answers to a 00, a 01 and a bad hello and to no hello at all (closed within --handshake-timeout-s \
            plus --close-margin-s), its fetch of our beacons after a 00 hello, and a yamux session over the \
            stream: a stream served as its port serves TCP, and closes carried both ways. Needs no keys. With \
            THALI_BLUETOOTH_STANDIN=<scope> in the environment the streams use the cross-process stand-in \
            instead of RFCOMM, as `run` does (a test configuration). Prints each case as it ends, then a \
            table; exits non-zero only when a MUST fails or --baseline does not hold.
            """)

    @Argument(help: ArgumentHelp("The implementation's Bluetooth address.", valueName: "address"))
    var address: String

    @Option(help: "The RFCOMM channel it listens on.")
    var channel = BluetoothConformanceConfiguration.defaultChannel

    @Option(help: ArgumentHelp("Our adapter's address (default: the kernel's choice; with the stand-in, 02:00:00:00:C0:DE).",
                               valueName: "address"))
    var localAddress: String?

    @Option(help: "The handshake timeout the implementation must keep, in seconds (the spec's: 5).")
    var handshakeTimeoutS: Double = 5

    @Option(help: "How much longer the suite waits for a silent stream to be closed, in seconds.")
    var closeMarginS: Double = 1

    @Option(help: "Longest wait for any other answer, in seconds.")
    var stepTimeoutS: Double = 5

    @OptionGroup var report: ReportOptions

    /// The suite's address on the stand-in when none is given.
    static let standInLocalAddress = "02:00:00:00:C0:DE"

    func validate() throws {
        guard BluetoothAddress(address) != nil else { throw ValidationError("not a Bluetooth address: \(address)") }
        if let localAddress, BluetoothAddress(localAddress) == nil {
            throw ValidationError("--local-address: not a Bluetooth address: \(localAddress)")
        }
        for (name, value) in [("--handshake-timeout-s", handshakeTimeoutS), ("--close-margin-s", closeMarginS),
                              ("--step-timeout-s", stepTimeoutS)] where !(value > 0 && value <= 600) {
            throw ValidationError("\(name) must be more than 0 and at most 600")
        }
    }

    func run() async throws {
        guard let target = BluetoothAddress(address) else { throw ValidationError("not a Bluetooth address: \(address)") }
        var configuration = BluetoothConformanceConfiguration(address: target)
        configuration.channel = channel
        configuration.handshakeTimeout = Self.amount(handshakeTimeoutS)
        configuration.closeMargin = Self.amount(closeMarginS)
        configuration.stepTimeout = Self.amount(stepTimeoutS)
        let transport: any BluetoothTransport
        // The same test configuration as `run`'s: host tests of whole processes, where there is no radio.
        if let scope = ProcessInfo.processInfo.environment[Run.standInEnvironmentKey], !scope.isEmpty {
            guard scope.utf8.count <= CrossProcessBluetoothTransport.maxScopeLength else {
                throw ValidationError("\(Run.standInEnvironmentKey) is longer than \(CrossProcessBluetoothTransport.maxScopeLength) bytes")
            }
            guard let local = BluetoothAddress(localAddress ?? Self.standInLocalAddress) else {
                throw ValidationError("--local-address: not a Bluetooth address")
            }
            FileHandle.standardError.write(Data("thali-node: Bluetooth streams use the cross-process stand-in (scope \(scope)), not RFCOMM: a test configuration\n".utf8))
            transport = CrossProcessBluetoothTransport(scope: scope, localAddress: local)
        } else {
            transport = RFCOMMTransport(localAddress: localAddress.flatMap { BluetoothAddress($0) })
        }
        try await report.grade(target: "bluetooth \(target) channel \(channel)", threads: 1) { [configuration] run, group in
            await BluetoothConformance(configuration: configuration, transport: transport, group: group).run(run)
        }
    }

    private static func amount(_ seconds: Double) -> TimeAmount { .nanoseconds(Int64(seconds * 1_000_000_000)) }
}
