import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import ThaliBLEBinding
import ThaliBeacons
import ThaliConformance
import ThaliNodeCore
import ThaliSSDP

/// `thali-node conformance target`: the suite announces scripted peers, correct and broken, and grades
/// what the implementation under test does with them.
struct ConformanceTargetCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "target",
        abstract: "Announce scripted peers, correct and broken, and grade what the implementation does with them.",
        discussion: """
            The implementation under test only has to run and listen for SSDP on --ssdp-port: it needs no \
            contact and no keys. The suite announces well-formed and deliberately broken alives (malformed \
            datagrams, another NT, bad USNs, a spoofed LOCATION, a forged byebye from --second-address) whose \
            locations it serves, and grades which the implementation fetches, how often, and that it \
            connects to none (no beacon is for it). With --peer-key and --identity (a contact of the \
            implementation), it also serves announcements for it: a tampered one, one whose first beacon is \
            a stranger's, and a replayed one must lead to no connection, a good one to a session. The suite \
            also listens on the group for the implementation's M-SEARCH datagrams and grades their form: an \
            implementation searches when it joins, so with --search-wait-s start it once the suite says it \
            listens. About six observation periods long. With --bluetooth ADDRESS the scripted peers reach \
            the implementation over Bluetooth links instead (RFCOMM, or the stand-in with \
            THALI_BLUETOOTH_STANDIN), one link each, whose 00 hello makes it fetch their locations; the SSDP \
            cases are N/A. Prints each case \
            as it ends, then a table; exits non-zero only when a MUST fails or --baseline does not hold.
            """)

    @Option(help: "Our IPv4 address: announcements go out from it and the scripted locations listen on it.")
    var address = "127.0.0.1"

    @Option(help: "A second local IPv4 address, for the forged byebye and the spoofed LOCATION (default: 127.0.0.2 on loopback).")
    var secondAddress: String?

    @Option(help: "SSDP UDP port.")
    var ssdpPort = SSDPDiscoveryConfiguration.defaultPort

    @Option(help: "SSDP multicast group.")
    var ssdpGroup = SSDPDiscoveryConfiguration.defaultGroupAddress

    @Option(help: "The implementation's public key (hex or base64): with --identity, announcements for it (tampered, good, replayed) are graded too.")
    var peerKey: String?

    @Option(help: "The suite's identity key file (PEM), which the implementation has as a contact.")
    var identity: String?

    @Option(help: "Seconds the implementation has to react to each step.")
    var observeS: Int64 = 3

    @Option(help: "Seconds to wait, before the script, for the implementation's first M-SEARCH (start it once the suite says it listens); 0 grades the searches the run happens to hear.")
    var searchWaitS: Int64 = 0

    @Option(help: ArgumentHelp("The implementation's Bluetooth address: scripted peers reach it over Bluetooth links instead of SSDP.",
                               valueName: "address"))
    var bluetooth: String?

    @Option(help: "With --bluetooth, the RFCOMM channel it listens on.")
    var channel = BluetoothConformanceConfiguration.defaultChannel

    @Option(help: ArgumentHelp("With --bluetooth, the address of the first scripted peer's link (default: the kernel's choice; with the stand-in, 02:00:00:00:C0:DE, the next peers the following addresses).",
                               valueName: "address"))
    var localAddress: String?

    @OptionGroup var report: ReportOptions

    func validate() throws {
        guard observeS >= 1 else { throw ValidationError("--observe-s must be at least 1") }
        guard (0...600).contains(searchWaitS) else { throw ValidationError("--search-wait-s must be from 0 to 600") }
        guard (peerKey == nil) == (identity == nil) else { throw ValidationError("--peer-key and --identity go together") }
        try validateBluetooth(bluetooth, localAddress: localAddress)
        guard bluetooth == nil || searchWaitS == 0 else { throw ValidationError("--search-wait-s is for SSDP, not --bluetooth") }
    }

    func run() async throws {
        var configuration = TargetConformanceConfiguration(address: address)
        if let secondAddress { configuration.secondAddress = secondAddress }
        configuration.ssdpPort = ssdpPort
        configuration.ssdpGroup = ssdpGroup
        configuration.observation = .seconds(observeS)
        configuration.searchWait = .seconds(searchWaitS)
        if searchWaitS > 0 {
            let line = TerminalText.escaped("listening on \(ssdpGroup):\(ssdpPort) for the implementation's M-SEARCH for up to \(searchWaitS) s: start it now")
            let json = report.json
            configuration.listening = {
                if json { StandardStream.error.write(line + "\n") } else { printNow(line) }
            }
        }
        if let peerKey, let identity {
            configuration.keys = (try ContactKey.parse(peerKey), try IdentityKeyFile.load(from: identity))
        }
        if let bluetooth {
            configuration.bluetooth = try suiteBluetoothLinks(bluetooth, channel: channel, localAddress: localAddress)
        }
        let target = bluetooth.map { "target over Bluetooth links to \($0) channel \(channel)" } ?? "target over SSDP \(ssdpGroup):\(ssdpPort) from \(address)"
        try await report.grade(target: target, threads: 1) { [configuration] run, group in
            await TargetConformance(configuration: configuration, group: group).run(run)
        }
    }
}
