import Foundation
import Testing
import ThaliBLEBinding

/// A private `dbus-daemon` with python-dbusmock's `bluez5` template on it: a stand-in for bluetoothd
/// that speaks the real BlueZ D-Bus API. Nothing touches the machine's own buses.
public final class BlueZMock: @unchecked Sendable {
    public let directory: String
    public let busAddress: String
    public let daemon: ChildProcess
    public var mock: ChildProcess?
    public let python: String
    /// The test's own connection, used to drive the mock (add adapters and devices, read call logs).
    public let control: DBusClient

    /// Whether the peers these tests need are installed: `dbus-daemon` and the test venv with
    /// python-dbusmock (`scripts/bootstrap.sh --test`). Under `scripts/test.sh`/CI they must be.
    public static var peersPresent: Bool {
        TestEnvironment.available(
            ChildProcess.which("dbus-daemon") != nil
                && ChildProcess.testVenvPython(packageRoot: PackagePaths.root()) != nil)
    }

    public struct Unavailable: Error, CustomStringConvertible {
        public let description: String
    }

    /// Starts the bus and, if `startBlueZ`, the mock bluetoothd.
    public init(startBlueZ: Bool = true) async throws {
        let root = PackagePaths.root()
        self.python = try #require(ChildProcess.testVenvPython(packageRoot: root), "no test venv: run scripts/bootstrap.sh --test")
        directory = NSTemporaryDirectory() + "thali-ble-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        daemon = try ChildProcess("dbus-daemon", ["--session", "--nofork", "--print-address",
                                                  "--address=unix:path=\(directory)/bus"])
        try await daemon.waitForOutput(containing: "unix:path=")
        let line = try #require(daemon.output.split(separator: "\n").first(where: { $0.hasPrefix("unix:path=") }),
                                "dbus-daemon printed no address: \(daemon.output)")
        busAddress = String(line)
        control = try DBusClient(address: busAddress, defaultTimeout: .seconds(5))
        if startBlueZ { try await startMock() }
    }

    deinit {
        control.close()
        // Stateless test peers: no need for a graceful exit.
        mock?.terminate(signal: SIGKILL)
        daemon.terminate(signal: SIGKILL)
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Starts (or restarts) the mock bluetoothd and waits until it owns `org.bluez`.
    public func startMock() async throws {
        mock = try ChildProcess(python, ["-m", "dbusmock", "--system", "--template", "bluez5"],
                                environment: ["DBUS_SYSTEM_BUS_ADDRESS": busAddress])
        let owned = try await waitUntil(timeout: .seconds(15), every: .milliseconds(50)) {
            let reply = try await control.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                               interface: "org.freedesktop.DBus", member: "NameHasOwner",
                                               arguments: [.string("org.bluez")])
            return reply.first?.bool == true
        }
        if owned { return }
        throw Unavailable(description: "the bluez5 mock did not appear: \(mock?.output ?? "")")
    }

    /// Kills the mock bluetoothd (as if it crashed).
    public func killMock() {
        mock?.terminate(signal: SIGKILL)
        mock = nil
    }

    // MARK: Driving the mock

    public func bluez(_ path: String, _ interface: String, _ member: String, _ arguments: [DBusValue] = []) async throws -> [DBusValue] {
        try await control.call(destination: "org.bluez", path: path, interface: interface, member: member, arguments: arguments)
    }

    @discardableResult
    public func addAdapter(_ name: String = "hci0") async throws -> String {
        try await bluez("/", "org.bluez.Mock", "AddAdapter", [.string(name), .string("thali-test")]).first?.string ?? ""
    }

    @discardableResult
    public func addDevice(_ address: String, adapter: String = "hci0") async throws -> String {
        try await bluez("/", "org.bluez.Mock", "AddDevice", [.string(adapter), .string(address), .string("peer")]).first?.string ?? ""
    }

    public func updateProperties(_ path: String, interface: String, _ properties: [(String, DBusValue)]) async throws {
        _ = try await bluez(path, "org.freedesktop.DBus.Mock", "UpdateProperties", [.string(interface), .properties(properties)])
    }

    /// The address BlueZ reports for `adapter`.
    public func address(of adapter: String) async throws -> BluetoothAddress {
        let reply = try await bluez("/org/bluez/\(adapter)", "org.freedesktop.DBus.Properties", "Get",
                                    [.string("org.bluez.Adapter1"), .string("Address")])
        return try #require(reply.first?.unwrapped.string.flatMap { BluetoothAddress($0) })
    }

    /// The arguments of every logged call of `method` on `path`.
    public func calls(_ path: String, _ method: String) async throws -> [[DBusValue]] {
        let reply = try await bluez(path, "org.freedesktop.DBus.Mock", "GetMethodCalls", [.string(method)])
        guard case .array(_, let calls)? = reply.first else { return [] }
        return calls.compactMap { call in
            guard case .structure(let fields) = call, fields.count == 2, case .array(_, let arguments) = fields[1] else { return nil }
            return arguments.map(\.unwrapped)
        }
    }

    /// Runs a Python snippet (with `dbus` imported, `bus` connected to the private bus, and `argv`) and
    /// returns its standard output.
    public func python(_ script: String, _ arguments: [String]) async throws -> String {
        let prelude = "import sys, dbus, socket\nbus = dbus.bus.BusConnection(sys.argv[1])\nargv = sys.argv[2:]\n"
        let child = try ChildProcess(python, ["-c", prelude + script, busAddress] + arguments)
        let status = try await child.waitForExit(timeout: .seconds(20))
        guard status == 0 else { throw Unavailable(description: "python failed (\(status)): \(child.output)") }
        return child.output
    }
}

/// Service data as BlueZ reports it: `a{sv}` of UUID → `ay`.
public func serviceData(_ uuid: String, _ bytes: [UInt8]) -> DBusValue {
    .dictionary(keySignature: "s", valueSignature: "v", [DBusDictionaryEntry(key: .string(uuid), value: .variant(.bytes(bytes)))])
}

/// Manufacturer data as BlueZ reports it: `a{qv}` of company → `ay`.
public func manufacturerData(_ company: UInt16, _ bytes: [UInt8]) -> DBusValue {
    .dictionary(keySignature: "q", valueSignature: "v", [DBusDictionaryEntry(key: .uint16(company), value: .variant(.bytes(bytes)))])
}
