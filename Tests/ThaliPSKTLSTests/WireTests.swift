import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliPSKTLS

/// The parts of a TLS 1.2 DHE_PSK ServerKeyExchange (RFC 4279 §3) that the profile constrains.
struct ServerKeyExchange {
    var identityHint: [UInt8]
    var prime: [UInt8]
    var generator: [UInt8]
    var publicValue: [UInt8]

    struct Malformed: Error {}

    /// Finds the ServerKeyExchange in a server's first flight (handshake records, possibly several).
    static func find(in flight: ByteBuffer) throws -> ServerKeyExchange {
        func read<T: FixedWidthInteger>(_ buffer: inout ByteBuffer, as: T.Type) throws -> T {
            guard let value = buffer.readInteger(as: T.self) else { throw Malformed() }
            return value
        }
        func vector(_ body: inout ByteBuffer) throws -> [UInt8] {
            let count = Int(try read(&body, as: UInt16.self))
            guard let bytes = body.readBytes(length: count) else { throw Malformed() }
            return bytes
        }
        var records = flight
        var handshake = ByteBuffer()
        while records.readableBytes >= 5 {
            let type = try read(&records, as: UInt8.self)
            _ = try read(&records, as: UInt16.self)
            let length = Int(try read(&records, as: UInt16.self))
            guard var fragment = records.readSlice(length: length) else { throw Malformed() }
            if type == 22 { handshake.writeBuffer(&fragment) }
        }
        while handshake.readableBytes >= 4 {
            let type = try read(&handshake, as: UInt8.self)
            let high = Int(try read(&handshake, as: UInt8.self))
            let low = Int(try read(&handshake, as: UInt16.self))
            guard var body = handshake.readSlice(length: high << 16 | low) else { throw Malformed() }
            guard type == 12 else { continue }
            return ServerKeyExchange(identityHint: try vector(&body), prime: try vector(&body),
                                     generator: try vector(&body), publicValue: try vector(&body))
        }
        throw Malformed()
    }
}

extension PSKTLSTests {
    /// What goes over the wire, read from the bytes themselves.
    @Suite struct WireTests {
        /// The 16 bytes after the leading 64 one-bits that every RFC 7919 prime shares (the binary digits
        /// of e, from which all of them are built); RFC 3526 primes continue with C90FDAA2 instead.
        static let rfc7919PrimeStart: [UInt8] = [
            0xAD, 0xF8, 0x54, 0x58, 0xA2, 0xBB, 0x4A, 0x9A, 0xAF, 0xDC, 0x56, 0x20, 0x27, 0x3D, 0x3C, 0xF1,
        ]

        /// The server's ServerKeyExchange for one handshake with `context`.
        static func serverKeyExchange(context: PSKTLSContext) throws -> ServerKeyExchange {
            let client = EmbeddedChannel()
            let server = EmbeddedChannel()
            defer {
                _ = try? client.finish(acceptAlreadyClosed: true)
                _ = try? server.finish(acceptAlreadyClosed: true)
            }
            try client.pipeline.syncOperations.addHandler(
                PSKTLSHandler(clientContext: try PSKTLSContext(role: .client), identity: "id", psk: Fixtures.psk))
            try server.pipeline.syncOperations.addHandler(PSKTLSHandler(serverContext: context, lookup: { _ in Fixtures.psk }))
            let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
            try server.connect(to: address).wait()
            try client.connect(to: address).wait()
            while let hello = try client.readOutbound(as: ByteBuffer.self) { try server.writeInbound(hello) }
            var flight = ByteBuffer()
            while var part = try server.readOutbound(as: ByteBuffer.self) { flight.writeBuffer(&part) }
            return try ServerKeyExchange.find(in: flight)
        }

        @Test(arguments: DHGroup.allCases)
        func theServerSendsNoHintTheNamedGroupAndAFreshKeyEachTime(group: DHGroup) throws {
            try expectNoLeaksNow {
                let context = try PSKTLSContext(role: .server, configuration: PSKTLSConfiguration(dhGroup: group))
                let first = try Self.serverKeyExchange(context: context)
                let second = try Self.serverKeyExchange(context: context)
                #expect(first.identityHint.isEmpty, "RFC 4279 §3 allows a hint; the seed forbids one")
                #expect(first.prime.count * 8 == group.bits)
                #expect(Array(first.prime.prefix(8)) == [UInt8](repeating: 0xFF, count: 8))
                #expect(Array(first.prime.dropFirst(8).prefix(16)) == Self.rfc7919PrimeStart)
                #expect(first.prime.suffix(8) == [UInt8](repeating: 0xFF, count: 8))
                #expect(first.generator == [2])
                #expect(second.prime == first.prime)
                // A new DH key pair for every handshake.
                #expect(first.publicValue != second.publicValue)
            }
        }
    }
}
