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
            table; exits non-zero only when a MUST fails or --baseline does not hold. With --client-wait-s, \
            it then listens on --listen-channel for the implementation to connect as a client (--advertise: \
            our address advertised through BlueZ meanwhile, so that it finds us) and grades its hello and \
            that it closes on a bad answer.
            """)

    @Argument(help: ArgumentHelp("The implementation's Bluetooth address.", valueName: "address"))
    var address: String

    @Option(help: "The RFCOMM channel it listens on.")
    var channel = BluetoothConformanceConfiguration.defaultChannel

    @Option(help: ArgumentHelp("The address our streams come from (default: the kernel's choice; with the stand-in, 02:00:00:00:C0:DE).",
                               valueName: "address"))
    var localAddress: String?

    @Option(help: "The handshake timeout the implementation must keep, in seconds (the spec's: 5).")
    var handshakeTimeoutS: Double = 5

    @Option(help: "How much longer the suite waits for a silent stream to be closed, in seconds.")
    var closeMarginS: Double = 1

    @Option(help: "Longest wait for any other answer, in seconds.")
    var stepTimeoutS: Double = 5

    @Option(help: "After the server cases, seconds to wait for the implementation to connect to us as a client (0: those cases are N/A).")
    var clientWaitS: Double = 0

    @Option(help: "The RFCOMM channel the suite listens on for the implementation as a client.")
    var listenChannel = BluetoothConformanceConfiguration.defaultChannel

    @Flag(help: "While waiting for the implementation as a client, advertise our address through BlueZ (DBUS_SYSTEM_BUS_ADDRESS).")
    var advertise = false

    @Option(help: ArgumentHelp("With --advertise, the adapter (default: the first powered one); the implementation connects to its address.",
                               valueName: "name"))
    var adapter: String?

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
        guard clientWaitS >= 0 && clientWaitS <= 600 else { throw ValidationError("--client-wait-s must be from 0 to 600") }
        guard !advertise || clientWaitS > 0 else { throw ValidationError("--advertise goes with --client-wait-s") }
    }

    func run() async throws {
        guard let target = BluetoothAddress(address) else { throw ValidationError("not a Bluetooth address: \(address)") }
        var configuration = BluetoothConformanceConfiguration(address: target)
        configuration.channel = channel
        configuration.handshakeTimeout = Self.amount(handshakeTimeoutS)
        configuration.closeMargin = Self.amount(closeMarginS)
        configuration.stepTimeout = Self.amount(stepTimeoutS)
        let environment = ProcessInfo.processInfo.environment
        // With --advertise, our address is the adapter's, the one the implementation will see.
        var advertiser: (client: BlueZClient, address: BluetoothAddress)?
        if advertise {
            let client = try BlueZClient(configuration: BlueZConfiguration(
                busAddress: environment["DBUS_SYSTEM_BUS_ADDRESS"] ?? "unix:path=/run/dbus/system_bus_socket", adapterName: adapter))
            guard let address = try await client.adapter().address else {
                client.close()
                throw ValidationError("the adapter has no address")
            }
            advertiser = (client, address)
        }
        defer { advertiser?.client.close() }
        // Our streams come from --local-address; the implementation as a client connects to the address we
        // advertise (the same on one radio; two apart on the stand-in, so that its pacing after one does
        // not hold up the other).
        let local = localAddress.flatMap { BluetoothAddress($0) }
        let listening = advertiser?.address ?? local
        let transport: any BluetoothTransport
        let listenTransport: any BluetoothTransport
        // The same test configuration as `run`'s: host tests of whole processes, where there is no radio.
        if let (scope, standIn) = try standInSuiteAddress(local, environment: environment) {
            transport = CrossProcessBluetoothTransport(scope: scope, localAddress: standIn)
            listenTransport = CrossProcessBluetoothTransport(scope: scope, localAddress: listening ?? standIn)
        } else {
            transport = RFCOMMTransport(localAddress: local)
            listenTransport = RFCOMMTransport(localAddress: listening)
        }
        // A machine without Bluetooth is our problem, not the implementation's: say so instead of grading.
        do {
            try transport.checkAvailable()
        } catch {
            throw ValidationError("cannot open Bluetooth streams here: \(error)")
        }
        let (clientWait, listenChannel) = (Self.amount(clientWaitS), self.listenChannel)
        try await report.grade(target: "bluetooth \(target) channel \(channel)", threads: 1) { [configuration, advertiser] run, group in
            let suite = BluetoothConformance(configuration: configuration, transport: transport, group: group)
            await suite.run(run)
            // After the server cases: the bad answer given here may pause the implementation's reaching us,
            // which must not delay its fetch after our 00 hello there.
            if clientWaitS > 0 {
                await Self.clientCases(suite, run, transport: listenTransport, channel: listenChannel, wait: clientWait, advertiser: advertiser)
            }
            run.recordRemaining(BluetoothConformance.Cases.client, .notApplicable, because: "not asked (--client-wait-s 0)")
        }
    }

    /// Listens, advertises if asked, says so (a test waits for the line), and grades the implementation as a client.
    private static func clientCases(_ suite: BluetoothConformance, _ run: ConformanceRun, transport: any BluetoothTransport,
                                    channel: UInt8, wait: TimeAmount,
                                    advertiser: (client: BlueZClient, address: BluetoothAddress)?) async {
        let listener: any BluetoothListener
        do {
            listener = try await transport.listen(channel: channel)
            if let advertiser { try await advertiser.client.advertise(ThaliAdvertisement(payload: .bluetoothAddress(advertiser.address))) }
        } catch {
            run.note("cannot wait for the implementation as a client: \(error)")
            run.recordRemaining(BluetoothConformance.Cases.client, .inconclusive, because: "cannot listen or advertise: \(error)")
            return
        }
        StandardStream.error.write("thali-node: waiting for the implementation to connect on channel \(channel)\n")
        await suite.runClientCases(run, on: listener, waitingUpTo: wait)
        try? await advertiser?.client.stopAdvertising()
    }

    private static func amount(_ seconds: Double) -> TimeAmount { .nanoseconds(Int64(seconds * 1_000_000_000)) }
}

/// Checks `--bluetooth ADDRESS` and `--local-address ADDRESS` of the modes that can run over a link.
func validateBluetooth(_ address: String?, localAddress: String?) throws {
    if let address, BluetoothAddress(address) == nil { throw ValidationError("--bluetooth: not a Bluetooth address: \(address)") }
    if let localAddress {
        guard address != nil else { throw ValidationError("--local-address goes with --bluetooth") }
        guard BluetoothAddress(localAddress) != nil else { throw ValidationError("--local-address: not a Bluetooth address: \(localAddress)") }
    }
}

/// With `THALI_BLUETOOTH_STANDIN=<scope>` in `environment` (the test configuration `run` reads too: host
/// tests of whole processes, where there is no radio), the scope and the suite's address on the stand-in
/// (`local`, else 02:00:00:00:C0:DE), announced on standard error; nil on a radio.
func standInSuiteAddress(_ local: BluetoothAddress?, environment: [String: String] = ProcessInfo.processInfo.environment) throws
    -> (scope: String, address: BluetoothAddress)? {
    guard let scope = environment[Run.standInEnvironmentKey], !scope.isEmpty else { return nil }
    guard scope.utf8.count <= CrossProcessBluetoothTransport.maxScopeLength else {
        throw ValidationError("\(Run.standInEnvironmentKey) is longer than \(CrossProcessBluetoothTransport.maxScopeLength) bytes")
    }
    guard let standIn = local ?? BluetoothAddress(ConformanceBluetoothCommand.standInLocalAddress) else {
        throw ValidationError("--local-address: not a Bluetooth address")
    }
    StandardStream.error.write("thali-node: Bluetooth streams use the cross-process stand-in (scope \(scope)), not RFCOMM: a test configuration\n")
    return (scope, standIn)
}

/// The implementation at `address` over Bluetooth, reached as `conformance bluetooth` reaches it: RFCOMM
/// from `localAddress` (nil: the kernel's choice), or with `THALI_BLUETOOTH_STANDIN=<scope>` the
/// cross-process stand-in (from `localAddress`, 02:00:00:00:C0:DE by default). Throws when this machine
/// cannot open Bluetooth streams: that is ours to fix, not the implementation's to fail.
func suiteBluetoothTarget(_ address: String, channel: UInt8, localAddress: String?) throws -> SuiteBluetoothTarget {
    try suiteBluetoothLinks(address, channel: channel, localAddress: localAddress).target
}

/// Like ``suiteBluetoothTarget(_:channel:localAddress:)``, for target mode's scripted peers: on the
/// stand-in the n-th comes from the local address plus n in its last octets (each peer another device),
/// on RFCOMM every one from the adapter's.
func suiteBluetoothLinks(_ address: String, channel: UInt8, localAddress: String?) throws -> TargetBluetoothLinks {
    guard let target = BluetoothAddress(address) else { throw ValidationError("--bluetooth: not a Bluetooth address: \(address)") }
    let local = localAddress.flatMap { BluetoothAddress($0) }
    let transport: any BluetoothTransport
    var transportForPeer: (@Sendable (Int) -> any BluetoothTransport)?
    if let (scope, standIn) = try standInSuiteAddress(local) {
        transport = CrossProcessBluetoothTransport(scope: scope, localAddress: standIn)
        transportForPeer = { index in
            let address = BluetoothAddress(octets: withUnsafeBytes(of: (standIn.value &+ UInt64(index)).bigEndian) { Array($0.suffix(6)) })
            return CrossProcessBluetoothTransport(scope: scope, localAddress: address ?? standIn)
        }
    } else {
        transport = RFCOMMTransport(localAddress: local)
    }
    do {
        try transport.checkAvailable()
    } catch {
        throw ValidationError("cannot open Bluetooth streams here: \(error)")
    }
    var suite = SuiteBluetoothTarget(address: target, transport: transport)
    suite.channel = channel
    return TargetBluetoothLinks(target: suite, transportForPeer: transportForPeer)
}
