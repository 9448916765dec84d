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

    /// Runs `scripts/bt-vm/<script>` in the guest with the built `thali-node` and `arguments`; expects
    /// it to succeed, and returns the figures line that starts with `{"<firstKey>"` and the guest's output.
    /// With `harnessConnectable` false the harness leaves page scan as bluetoothd set it (off).
    static func runInGuest<Figures: Decodable>(_ script: String, _ arguments: [String], figures: Figures.Type,
                                               firstKey: String, harnessConnectable: Bool = true) throws -> (Figures, String) {
        let node = try #require(PackagePaths.thaliNode())
        let job = FileManager.default.temporaryDirectory.appendingPathComponent("thali-bt-vm-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: job) }
        var environment = ProcessInfo.processInfo.environment
        environment["BT_VM_JOB"] = job
        environment["BT_VM_TIMEOUT"] = "240"
        environment["BT_VM_CONNECTABLE"] = harnessConnectable ? "1" : "0"
        let result = try ChildProcess.run("/bin/bash", ["\(root)/scripts/bt-vm/run.sh", "bash", "\(root)/scripts/bt-vm/\(script)", node]
                                              + arguments,
                                          environment: environment, timeout: .seconds(300))
        print(result.output)
        let guestLog = (try? String(contentsOfFile: "\(job)/bluetoothd.log", encoding: .utf8)) ?? ""
        #expect(result.status == 0, "bt-vm exited \(result.status); bluetoothd said:\n\(guestLog)")
        // The guest's console ends lines with CR LF.
        let line = try #require(result.output.split(whereSeparator: \.isNewline).first { $0.hasPrefix("{\"\(firstKey)\"") },
                                "no figures from \(script)")
        return (try JSONDecoder().decode(Figures.self, from: Data(line.utf8)), result.output)
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
        let (figures, _) = try Self.runInGuest("radio-bench.sh", ["65536"], figures: RadioFigures.self, firstKey: "advertiser")
        #expect(figures.relay_bytes == 65536)
        #expect(figures.relay_intact)
        #expect(figures.ble_discovery_s > 0)
        #expect(figures.rfcomm_connect_s > 0)
    }

    /// `scripts/bt-vm/demo.sh`: `thali-node demo --bluetooth` in the guest, Alice and Bob on two emulated
    /// controllers: it says the radio is emulated, and every item reaches its inbox once, intact.
    @Test(.enabled(if: geteuid() == 0 && TestEnvironment.available(vmAvailable && PackagePaths.thaliNode() != nil)))
    func theDemoRunsOverRealBlueZ() throws {
        let node = try #require(PackagePaths.thaliNode())
        let result = try ChildProcess.run("/bin/bash", ["\(Self.root)/scripts/bt-vm/demo.sh", node, "--timeout", "90", "--pace", "0"],
                                          timeout: .seconds(300))
        print(result.output)
        #expect(result.status == 0)
        #expect(result.output.contains("The radio is emulated"))
        #expect(result.output.contains("two peers on Bluetooth adapters hci0, hci1"))
        #expect(result.output.contains("3 of 3 items verified in the right inbox, exactly once, content intact"))
        #expect(result.output.contains("Every item reached its contact, and only its contact."))
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
        let (figures, output) = try Self.runInGuest("node-pair.sh", ["65536", "90"], figures: NodePairFigures.self,
                                                    firstKey: "alice_inbox", harnessConnectable: false)
        #expect(output.contains("Bluetooth adapter hci0 had page scan off; made it discoverable"), "alice did not make hci0 connectable")
        #expect(output.contains("Bluetooth adapter hci1 had page scan off; made it discoverable"), "bob did not make hci1 connectable")
        #expect(figures.node_pair_ok)
        #expect(figures.alice_inbox == 1)
        #expect(figures.bob_inbox == 2)
        #expect(figures.node_first_delivery_s != nil)
    }
}
