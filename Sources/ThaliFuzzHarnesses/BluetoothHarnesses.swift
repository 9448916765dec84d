import NIOCore
import NIOEmbedded
import ThaliBLEBinding

/// Advertising payloads (legacy and extended lengths) through the AD structure parser and the Thali
/// claim decoder.
///
/// Invariants: a payload that parses re-serialises to its significant part (the bytes before the zero
/// padding); a decoded Thali advertisement, encoded again, decodes to the same advertisement.
enum AdvertisingDataHarness {
    static let name = "ble-advdata"

    static let harness = FuzzHarness(name: name, summary: "BLE AdvData and the Thali advertisement in it", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let extended = input.bool()
        let payload = input.rest()
        let maximum = extended ? AdvertisingData.extendedMaximumLength : AdvertisingData.legacyMaximumLength
        if let structures = try? AdvertisingData.parse(payload, maximumLength: maximum) {
            let serialized = AdvertisingData.serialize(structures)
            try check(payload.starts(with: serialized) && payload.dropFirst(serialized.count).allSatisfy { $0 == 0 }, name,
                      "re-serialised payload differs from the significant part")
        }
        if let advertisement = try? ThaliAdvertisement.decode(advertisingData: payload, maximumLength: maximum) {
            let again = try? ThaliAdvertisement.decode(advertisingData: advertisement.advertisingData(), maximumLength: AdvertisingData.extendedMaximumLength)
            try check(again?.payload == advertisement.payload, name, "\(advertisement) does not survive re-encoding")
        }
    }

    static func seeds() -> [[UInt8]] {
        var seeds: [[UInt8]] = []
        if let address = BluetoothAddress("11:22:33:44:55:66") {
            seeds.append([0] + ThaliAdvertisement(payload: .bluetoothAddress(address)).advertisingData())
            seeds.append([1] + ThaliAdvertisement(payload: .bluetoothAddress(address), generation: 3, encoding: .manufacturerData).advertisingData())
        }
        seeds.append([0] + ThaliAdvertisement(payload: .iOSDevice).advertisingData() + [0, 0, 0])
        return seeds
    }
}

/// The one-octet Bluetooth handshake through the real handler on an `EmbeddedChannel`, as server or
/// client, with the bytes split at random points and a relay behind it.
///
/// Invariants: the server acknowledges exactly the hellos 0 and 1 and sends nothing else; the client
/// completes exactly on 0; after success every following byte reaches the relay, in order; after a
/// violation the channel is closed and nothing reaches the relay.
enum BluetoothHandshakeHarness {
    static let name = "bluetooth-handshake"

    final class Relay: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        var received: [UInt8] = []
        func channelRead(context: ChannelHandlerContext, data: NIOAny) { received += unwrapInboundIn(data).readableBytesView }
    }

    static let harness = FuzzHarness(name: name, summary: "the Bluetooth handshake handler, server and client", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let server = input.bool()
        let cuts = takeCuts(&input, maximum: 4)
        let bytes = input.rest()
        let channel = EmbeddedChannel()
        let relay = Relay()
        let outcome = channel.eventLoop.makePromise(of: BluetoothHandshake.Outcome.self)
        let result = OutcomeBox<Result<BluetoothHandshake.Outcome, any Error>>()
        outcome.futureResult.whenComplete { result.value = $0 }
        let handler = BluetoothHandshakeHandler(role: server ? .server : .client(.hasNotifications), timeout: .seconds(5),
                                                outcome: outcome, successor: relay)
        do {
            try channel.pipeline.syncOperations.addHandler(handler)
            try channel.connect(to: SocketAddress(ipAddress: "192.0.2.1", port: 1)).wait()
        } catch {
            outcome.fail(error)
            return
        }
        for piece in splitPieces(bytes, cuts: cuts) where channel.isActive {
            _ = try? channel.writeInbound(ByteBuffer(bytes: piece))
        }
        var sent: [UInt8] = []
        while let buffer = try? channel.readOutbound(as: ByteBuffer.self) { sent += buffer.readableBytesView }
        let stillOpen = channel.isActive
        _ = try? channel.finish(acceptAlreadyClosed: true)
        guard let first = bytes.first else { return }
        let valid = server ? first <= 1 : first == 0
        if valid {
            try check((try? result.value?.get()) != nil, name, "a valid handshake octet \(first) did not complete: \(String(describing: result.value))")
            try check(relay.received == Array(bytes.dropFirst()), name, "the relay got \(relay.received.count) of \(bytes.count - 1) bytes")
            try check(sent == (server ? [0] : [0]), name, "sent \(sent)")
        } else {
            try check(!stillOpen, name, "the channel stayed open after the invalid octet \(first)")
            try check(relay.received.isEmpty, name, "bytes reached the relay after a failed handshake")
            try check(sent == (server ? [] : [0]), name, "sent \(sent) on a failed handshake")
        }
    }

    static func seeds() -> [[UInt8]] {
        [[1, 0, 0], [1, 2, 1, 0, 3, 0, 1, 2, 3, 4], [0, 0, 0, 0x16, 3, 1], [1, 0, 7]]
    }
}

/// D-Bus messages in wire format, unmarshalled by libdbus and read into `DBusValue`s by our reader.
///
/// Invariant: whatever we read we can write back: the values appended to a new message read back the same.
enum DBusMessageHarness {
    static let name = "dbus-message"

    static let harness = FuzzHarness(name: name, summary: "D-Bus wire messages read into DBusValue", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let bytes = input.rest()
        guard let message = try? DBusMessageRef.demarshal(bytes), let values = try? message.arguments() else { return }
        guard !values.contains(where: containsFileDescriptor) else { return }  // cannot be written back without a real descriptor
        do {
            let copy = try DBusMessageRef.methodCall(destination: nil, path: "/fuzz", interface: "org.thali.Fuzz", member: "Echo")
            try copy.append(values)
            let again = try copy.arguments()
            try check(String(describing: again) == String(describing: values), name, "values do not survive writing back")
        } catch let violation as FuzzInvariantViolation {
            throw violation
        } catch {
            throw FuzzInvariantViolation(harness: name, detail: "cannot write back what we read: \(error)")
        }
    }

    static func containsFileDescriptor(_ value: DBusValue) -> Bool {
        switch value {
        case .unixFD: return true
        case .variant(let inner): return containsFileDescriptor(inner)
        case .structure(let fields): return fields.contains(where: containsFileDescriptor)
        case .array(_, let elements): return elements.contains(where: containsFileDescriptor)
        case .dictionary(_, _, let entries): return entries.contains { containsFileDescriptor($0.key) || containsFileDescriptor($0.value) }
        default: return false
        }
    }

    /// The shapes BlueZ sends us: an InterfacesAdded-like signal body and a properties dictionary.
    static func seeds() -> [[UInt8]] {
        var seeds: [[UInt8]] = []
        let bodies: [[DBusValue]] = [
            [.objectPath("/org/bluez/hci0/dev_11_22_33_44_55_66"),
             .properties([("Address", .variant(.string("11:22:33:44:55:66"))), ("RSSI", .variant(.int16(-40))),
                          ("ServiceData", .variant(.dictionary(keySignature: "s", valueSignature: "v", [
                              DBusDictionaryEntry(key: .string("b6a44ad1-d319-4b3a-815d-8b805a47fb51"),
                                                  value: .variant(.bytes([0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66]))),
                          ])))])],
            [.string("org.bluez.Adapter1"), .properties([("Powered", .variant(.boolean(true)))]), .strings(["Discovering"])],
            [.uint32(7), .structure([.byte(1), .uint64(2), .double(0.5)])],
        ]
        for body in bodies {
            guard let message = try? DBusMessageRef.methodCall(destination: "org.bluez", path: "/org/bluez/hci0",
                                                                 interface: "org.freedesktop.DBus.Properties", member: "Changed"),
                  (try? message.append(body)) != nil, let bytes = try? message.marshal()
            else { continue }
            seeds.append(bytes)
        }
        return seeds
    }
}
