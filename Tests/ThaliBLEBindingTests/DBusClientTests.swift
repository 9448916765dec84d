import Foundation
import NIOConcurrencyHelpers
import Testing
@testable import ThaliBLEBinding

/// The libdbus wrapper against a real (private) dbus-daemon.
@Suite(.serialized, .enabled(if: BlueZMock.peersPresent, "needs dbus-daemon and python-dbusmock"), .timeLimit(.minutes(1))) struct DBusClientTests {
    @Test func refusesAnUnreachableBus() {
        #expect(throws: DBusClientError.self) {
            _ = try DBusClient(address: "unix:path=/nonexistent/thali-\(getpid())/bus")
        }
    }

    /// Every type survives a trip through the daemon: one connection exports an echo object, another
    /// calls it.
    @Test func valuesRoundTripThroughTheBus() async throws {
        let bus = try await BlueZMock(startBlueZ: false)
        let server = try DBusClient(address: bus.busAddress)
        defer { server.close() }
        try server.export(path: "/org/thaliproject/test/echo") { call in
            call.member == "Echo" ? .values(call.arguments) : .error(name: "org.thaliproject.Test.NoSuchMethod", message: call.member)
        }
        let values: [DBusValue] = [
            .byte(0xFF), .boolean(true), .int16(-2), .uint16(65535), .int32(-3), .uint32(4_000_000_000),
            .int64(.min), .uint64(.max), .double(-0.5), .string("Thali ✓"), .objectPath("/a/b_c"), .signature("a{sv}"),
            .bytes([]), .bytes([0, 1, 2, 255]), .strings(["x", ""]),
            .properties([("Type", .string("broadcast")), ("Nested", .properties([("n", .uint16(7))]))]),
            .dictionary(keySignature: "q", valueSignature: "v", [DBusDictionaryEntry(key: .uint16(7413), value: .variant(.bytes([2, 0x15])))]),
            .structure([.int32(1), .array(elementSignature: "(ys)", [.structure([.byte(1), .string("one")])])]),
            .variant(.variant(.string("deep"))),
        ]
        let echoed = try await bus.control.call(destination: server.uniqueName, path: "/org/thaliproject/test/echo",
                                                interface: "org.thaliproject.Test", member: "Echo", arguments: values)
        #expect(echoed == values)
        await #expect(throws: DBusClientError.remote(name: "org.thaliproject.Test.NoSuchMethod", message: "Other")) {
            _ = try await bus.control.call(destination: server.uniqueName, path: "/org/thaliproject/test/echo",
                                           interface: "org.thaliproject.Test", member: "Other")
        }
        await #expect(throws: DBusClientError.remote(name: "org.freedesktop.DBus.Error.UnknownObject",
                                                     message: "no object at /org/thaliproject/test/none")) {
            _ = try await bus.control.call(destination: server.uniqueName, path: "/org/thaliproject/test/none",
                                           interface: "org.thaliproject.Test", member: "Echo")
        }
    }

    /// Values libdbus would abort the process on are refused with a typed error instead.
    @Test func refusesValuesLibdbusWouldAbortOn() async throws {
        let bus = try await BlueZMock(startBlueZ: false)
        let invalid: [DBusValue] = [
            .objectPath("not/a/path"), .objectPath("/trailing/"), .objectPath("/a//b"), .string("nul\0inside"),
            .signature("a{"), .array(elementSignature: "s", [.int32(1)]),
            .dictionary(keySignature: "s", valueSignature: "v", [DBusDictionaryEntry(key: .int32(1), value: .variant(.byte(1)))]),
        ]
        for value in invalid {
            let error = await #expect(throws: DBusClientError.self) {
                _ = try await bus.control.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                               interface: "org.freedesktop.DBus", member: "Ping", arguments: [value])
            }
            // Refused before sending, not by the bus.
            guard case .invalidArgument? = error else {
                Issue.record("\(value) gave \(String(describing: error))")
                continue
            }
        }
        await #expect(throws: DBusClientError.invalidArgument("object path bad path")) {
            _ = try await bus.control.call(destination: "org.freedesktop.DBus", path: "bad path",
                                           interface: "org.freedesktop.DBus", member: "Ping")
        }
        // The connection is still fine afterwards.
        let reply = try await bus.control.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                               interface: "org.freedesktop.DBus", member: "GetId")
        #expect(reply.first?.string?.count == 32)
    }

    /// `close()` while calls are queued for the connection's thread: every call ends, with its reply or
    /// `.disconnected`; none is left suspended (a call that never returns hangs whoever awaits it, such as
    /// a Bluetooth binding stopping).
    @Test func everyCallRacingCloseEnds() async throws {
        let bus = try await BlueZMock(startBlueZ: false)
        let (started, ended) = (NIOLockedValueBox(0), NIOLockedValueBox(0))
        for round in 0..<40 {
            let client = try DBusClient(address: bus.busAddress)
            for _ in 0..<4 {
                started.withLockedValue { $0 += 1 }
                Task {
                    do {
                        _ = try await client.call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                                                  interface: "org.freedesktop.DBus", member: "GetId")
                    } catch {
                        #expect(error as? DBusClientError == .disconnected, "\(error)")
                    }
                    ended.withLockedValue { $0 += 1 }
                }
            }
            // Close at varying points: before, while and after the calls reach the connection's thread. A sleep,
            // kept: the varying delay is the property under test (every timing of the race); nothing waits on it.
            try await Task.sleep(for: .microseconds(250 * (round % 20)))
            client.close()
        }
        _ = try await waitUntil(timeout: .seconds(5)) { ended.withLockedValue { $0 } >= started.withLockedValue { $0 } }
        #expect(ended.withLockedValue { $0 } == started.withLockedValue { $0 }, "calls still waiting after close()")
    }
}
