import Foundation
import Testing
import ThaliTestSupport

/// The binding and the node over the real Linux Bluetooth stack: `scripts/bt-vm/run.sh` boots Debian's
/// kernel in a QEMU guest with two virtual controllers (`btvirt -l2`) and the real `bluetoothd`, and runs
/// a script of `scripts/bt-vm/` there with our built `thali-node`. The radio is emulated; everything above
/// it (kernel, bluetoothd, our binary) is the real thing.
@Suite(.serialized) struct RealBlueZTests {
    static let root = PackagePaths.root()
    static var vmAvailable: Bool {
        ChildProcess.which("qemu-system-x86_64") != nil && ChildProcess.which("btvirt") != nil
            && ((try? FileManager.default.contentsOfDirectory(atPath: "/boot")) ?? []).contains { $0.hasPrefix("vmlinuz-") }
    }

    /// What `scripts/bt-vm/checks.sh` printed in one guest: each part's output and exit status.
    struct GuestChecks: Sendable {
        var parts: [String: (status: Int, output: String)] = [:]
        var whole: String

        /// The part's output, after checking that it ran and succeeded.
        func part(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
            let found = try #require(parts[name], "the guest did not run \(name):\n\(whole)", sourceLocation: sourceLocation)
            #expect(found.status == 0, "\(name) exited \(found.status):\n\(found.output)", sourceLocation: sourceLocation)
            return found.output
        }

        /// The line of figures in `output` that starts with `{"<firstKey>"`.
        func figures<Figures: Decodable>(_ type: Figures.Type, in output: String, firstKey: String) throws -> Figures {
            // The guest's console ends lines with CR LF.
            let line = try #require(output.split(whereSeparator: \.isNewline).first { $0.hasPrefix("{\"\(firstKey)\"") },
                                    "no figures starting with \(firstKey)")
            return try JSONDecoder().decode(Figures.self, from: Data(line.utf8))
        }
    }

    /// The three checks share one boot of the guest (15-20 s with KVM, about 50 s under emulation in CI):
    /// `scripts/bt-vm/checks.sh` runs them in turn with the adapters as bluetoothd leaves them (page
    /// scan off), and each test reads its part. Run once, by whichever test comes first.
    static let guestChecks: Result<GuestChecks, any Error> = Result { try runChecksInGuest() }

    static func runChecksInGuest() throws -> GuestChecks {
        let node = try #require(PackagePaths.thaliNode())
        let job = FileManager.default.temporaryDirectory.appendingPathComponent("thali-bt-vm-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: job) }
        var environment = ProcessInfo.processInfo.environment
        environment["BT_VM_JOB"] = job
        environment["BT_VM_TIMEOUT"] = "420"
        environment["BT_VM_CONNECTABLE"] = "0"
        let result = try ChildProcess.run("/bin/bash", ["\(root)/scripts/bt-vm/run.sh", "bash", "\(root)/scripts/bt-vm/checks.sh", node,
                                                        "65536", "90"],
                                          environment: environment, timeout: .seconds(480))
        print(result.output)
        let guestLog = (try? String(contentsOfFile: "\(job)/bluetoothd.log", encoding: .utf8)) ?? ""
        // The guest kernel's own console lines (errors and worse: run.sh boots it with loglevel=3), which
        // run.sh leaves out of its output: a BUG or oops there is why a guest stopped answering.
        let console = (try? String(contentsOfFile: "\(job)/console.log", encoding: .utf8)) ?? ""
        let kernelLines = console.split(whereSeparator: \.isNewline).filter { $0.hasPrefix("[") && $0.contains("] ") }
        var checks = GuestChecks(whole: result.output + "\n--- bluetoothd:\n" + guestLog
                                     + "\n--- guest kernel (errors):\n" + kernelLines.suffix(80).joined(separator: "\n"))
        var current: (name: String, lines: [Substring])?
        for rawLine in result.output.split(whereSeparator: \.isNewline) {
            let line = rawLine.trimmingCharacters(in: .whitespaces)
            if line.hasPrefix("=== "), let open = current, line.hasPrefix("=== \(open.name) status "),
               let status = Int(line.dropFirst("=== \(open.name) status ".count)) {
                checks.parts[open.name] = (status, open.lines.joined(separator: "\n"))
                current = nil
            } else if line.hasPrefix("=== "), current == nil {
                current = (String(line.dropFirst(4)), [])
            } else {
                current?.lines.append(rawLine)
            }
        }
        return checks
    }

    struct RadioFigures: Decodable {
        var ble_discovery_s: Double
        var rfcomm_connect_s: Double
        var relay_bytes: Int
        var relay_intact: Bool
        var relay_s: Double
    }

    /// `thali-node bench ble --radio hci0,hci1`: our advertisement registered through BlueZ on one
    /// controller is found by a scan on the other, then the relay carries 64 KiB over kernel RFCOMM.
    @Test(.enabled(if: geteuid() == 0 && TestEnvironment.available(vmAvailable && PackagePaths.thaliNode() != nil)))
    func advertiseScanAndRelay64KiBOverRealBlueZ() throws {
        let checks = try Self.guestChecks.get()
        let figures = try checks.figures(RadioFigures.self, in: try checks.part("radio-bench"), firstKey: "advertiser")
        #expect(figures.relay_bytes == 65536)
        #expect(figures.relay_intact)
        #expect(figures.ble_discovery_s > 0)
        #expect(figures.rfcomm_connect_s > 0)
    }

    /// `thali-node demo --bluetooth` in the guest (what `scripts/bt-vm/demo.sh` runs), Alice and Bob on two
    /// emulated controllers: every item reaches its inbox once, intact.
    @Test(.enabled(if: geteuid() == 0 && TestEnvironment.available(vmAvailable && PackagePaths.thaliNode() != nil)))
    func theDemoRunsOverRealBlueZ() throws {
        let output = try Self.guestChecks.get().part("demo")
        #expect(output.contains("two peers on Bluetooth adapters hci0, hci1"), "\(output)")
        #expect(output.contains("3 of 3 items verified in the right inbox, exactly once, content intact"), "\(output)")
        #expect(output.contains("Every item reached its contact, and only its contact."), "\(output)")
    }

    struct NodePairFigures: Decodable {
        var node_pair_ok: Bool
        var alice_inbox: Int
        var bob_inbox: Int
        var node_first_delivery_s: Double?
    }

    /// Two `thali-node run --bluetooth --no-wifi` processes, one per virtual controller, exchange texts
    /// both ways and a 64 KiB file over real BlueZ and kernel RFCOMM; each inbox holds its items once.
    /// The controllers start as bluetoothd leaves them, page scan off: the nodes turn it on themselves.
    @Test(.enabled(if: geteuid() == 0 && TestEnvironment.available(vmAvailable && PackagePaths.thaliNode() != nil)))
    func twoNodesDeliverOverRealBluetooth() throws {
        let checks = try Self.guestChecks.get()
        let output = try checks.part("node-pair")
        let figures = try checks.figures(NodePairFigures.self, in: output, firstKey: "alice_inbox")
        #expect(output.contains("Bluetooth adapter hci0 had page scan off; made it discoverable"), "alice did not make hci0 connectable")
        #expect(output.contains("Bluetooth adapter hci1 had page scan off; made it discoverable"), "bob did not make hci1 connectable")
        #expect(figures.node_pair_ok)
        #expect(figures.alice_inbox == 1)
        #expect(figures.bob_inbox == 2)
        #expect(figures.node_first_delivery_s != nil)
    }
}
