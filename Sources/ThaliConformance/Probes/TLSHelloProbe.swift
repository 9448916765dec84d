import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliSupport

/// A hand-built TLS ClientHello, and what a server answers to it up to its first flight: enough to grade
/// refusals (TLS 1.3 only, other suites) and the DHE parameters of a DHE-PSK ServerKeyExchange, which a
/// server sends before it learns the client's PSK identity. OpenSSL would refuse to send these hellos,
/// so the bytes are written here (RFC 5246 §7.4.1.2, RFC 8446 §4.1.2).
public enum TLSHelloProbe {
    /// What the server's answer was.
    public enum Outcome: Sendable, Hashable, CustomStringConvertible {
        /// A fatal (or warning) alert: level and description code.
        case alert(level: UInt8, description: UInt8)
        /// A ServerHello (and, when sent, the DHE-PSK ServerKeyExchange) up to ServerHelloDone.
        case serverHello(ServerFlight)
        /// The server closed the connection without an alert.
        case closed
        /// Nothing decisive within the timeout.
        case timedOut
        /// No TCP connection.
        case connectFailed(String)
        /// Bytes that are not a TLS 1.2 first flight.
        case malformed(String)

        public var description: String {
            switch self {
            case .alert(let level, let code): "\(level == 2 ? "fatal" : "warning") alert \(alertName(code))"
            case .serverHello(let flight):
                "ServerHello version 0x\(hex16(flight.version)), suite 0x\(hex16(flight.cipherSuite))"
                    + (flight.keyExchange.map { ", DH prime of \($0.primeBits) bits" } ?? "")
            case .closed: "connection closed without an alert"
            case .timedOut: "no answer in time"
            case .connectFailed(let detail): "no TCP connection: \(detail)"
            case .malformed(let detail): "not a TLS answer: \(detail)"
            }
        }
    }

    /// The server's first flight after a ServerHello.
    public struct ServerFlight: Sendable, Hashable {
        /// `server_version` of the ServerHello.
        public var version: UInt16
        /// The chosen cipher suite.
        public var cipherSuite: UInt16
        /// The chosen compression method (0: none).
        public var compressionMethod: UInt8 = 0
        /// The extension types of the ServerHello, in order.
        public var extensions: [UInt16] = []
        /// The DHE-PSK ServerKeyExchange, when the flight had one.
        public var keyExchange: DHEKeyExchange?
    }

    /// The fields of a DHE-PSK ServerKeyExchange (RFC 4279 §3).
    public struct DHEKeyExchange: Sendable, Hashable {
        /// `psk_identity_hint` (empty: no hint).
        public var identityHint: [UInt8]
        /// The prime `dh_p`.
        public var prime: [UInt8]
        /// The generator `dh_g`.
        public var generator: [UInt8]
        /// The server's public value `dh_Ys`.
        public var serverPublic: [UInt8]

        /// Bits of the prime (leading zero bits not counted).
        public var primeBits: Int {
            guard let first = prime.firstIndex(where: { $0 != 0 }) else { return 0 }
            return (prime.count - first) * 8 - prime[first].leadingZeroBitCount
        }
    }

    /// Which hello to send.
    public enum Hello: Sendable, Hashable {
        /// TLS 1.3 only: `supported_versions` = {TLS 1.3}, the three TLS 1.3 suites, an X25519 key share.
        case tls13Only
        /// TLS 1.2 offering only suites other than 0x00AB: ECDHE/DHE-RSA, plain PSK and DHE-PSK with AES-128.
        case otherSuitesOnly
        /// TLS 1.2 offering only TLS_DHE_PSK_WITH_AES_256_GCM_SHA384, with DEFLATE compression before none
        /// and an empty session ticket extension: a conforming server picks no compression and sends no
        /// ticket extension back.
        case thaliSuite
    }

    /// The suites `Hello.otherSuitesOnly` offers.
    static let otherSuites: [UInt16] = [0xC030, 0xC02F, 0x009F, 0x009E, 0x00A9, 0x008D, 0x00AA, 0x00B3]

    /// The record that carries `hello`.
    public static func record(_ hello: Hello) -> [UInt8] {
        let suites: [UInt16]
        var extensions: [UInt8] = []
        // signature_algorithms: ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256.
        extensions += ext(0x000D, u16list([0x0403, 0x0804, 0x0401]))
        switch hello {
        case .tls13Only:
            suites = [0x1301, 0x1302, 0x1303]
            extensions += ext(0x002B, [2, 0x03, 0x04])  // supported_versions: TLS 1.3
            extensions += ext(0x000A, u16list([0x001D]))  // supported_groups: x25519
            let share = [0x00, 0x1D] + u16(32) + randomBytes(32)
            extensions += ext(0x0033, u16(share.count) + share)  // key_share
        case .otherSuitesOnly:
            suites = otherSuites
            extensions += ext(0x000A, u16list([0x001D, 0x0017]))
            extensions += ext(0x000B, [1, 0])  // ec_point_formats: uncompressed
        case .thaliSuite:
            suites = [0x00AB]
            extensions += ext(0x0023, [])  // session_ticket: asks for a ticket
        }
        let compression: [UInt8] = hello == .thaliSuite ? [2, 1, 0] : [1, 0]  // DEFLATE, null / null only
        var body: [UInt8] = [0x03, 0x03] + randomBytes(32) + [0]  // legacy version, random, no session id
        body += u16(suites.count * 2) + suites.flatMap { u16($0) }
        body += compression
        body += u16(extensions.count) + extensions
        let handshake: [UInt8] = [1] + u24(body.count) + body
        return [0x16, 0x03, 0x01] + u16(handshake.count) + handshake
    }

    /// Largest answer read before giving up: a first flight with a 4096-bit group is about 1.1 KB.
    public static let maximumAnswerBytes = 64 << 10

    /// Connects to `host:port`, sends `hello` and reads the answer up to ServerHelloDone or an alert.
    public static func send(_ hello: Hello, host: String, port: Int, timeout: TimeAmount,
                            group: EventLoopGroup) async -> Outcome {
        let channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>
        do {
            channel = try await ClientBootstrap(group: group)
                .connectTimeout(timeout)
                .connect(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                    }
                }
        } catch {
            return .connectFailed("\(error)")
        }
        let bytes = record(hello)
        return await withTaskGroup(of: Outcome?.self) { tasks in
            tasks.addTask {
                do {
                    return try await channel.executeThenClose { (inbound, outbound) -> Outcome in
                        try await outbound.write(ByteBuffer(bytes: bytes))
                        var parser = FlightParser()
                        for try await buffer in inbound {
                            if let outcome = parser.feed(Array(buffer.readableBytesView)) { return outcome }
                        }
                        return .closed
                    }
                } catch {
                    return .closed
                }
            }
            tasks.addTask {
                try? await Task.sleep(nanoseconds: UInt64(max(0, timeout.nanoseconds)))
                return Task.isCancelled ? nil : Outcome.timedOut
            }
            let first = await tasks.next() ?? nil
            tasks.cancelAll()
            channel.channel.close(promise: nil)
            return first ?? .timedOut
        }
    }

    /// Reassembles handshake messages from records until the answer is decided. Fed the server's bytes
    /// as they arrive, in pieces of any size; the first non-nil result is the outcome.
    package struct FlightParser {
        private var records: [UInt8] = []
        private var handshake: [UInt8] = []
        private var flight: ServerFlight?
        /// Every byte of the answer so far: the bound holds for the whole answer, not just for what is
        /// buffered, so records that each fit cannot add up to an unbounded handshake message.
        private var received = 0

        package init() {}

        package mutating func feed(_ bytes: [UInt8]) -> Outcome? {
            received += bytes.count
            guard received <= TLSHelloProbe.maximumAnswerBytes else { return .malformed("answer over 64 KiB") }
            records += bytes
            while records.count >= 5 {
                let type = records[0]
                let length = Int(records[3]) << 8 | Int(records[4])
                guard length <= 18_432 else { return .malformed("record of \(length) bytes") }
                guard records.count >= 5 + length else { return nil }
                let fragment = Array(records[5..<(5 + length)])
                records.removeFirst(5 + length)
                switch type {
                case 0x15:
                    guard fragment.count >= 2 else { return .malformed("short alert") }
                    return .alert(level: fragment[0], description: fragment[1])
                case 0x16:
                    handshake += fragment
                    if let outcome = readMessages() { return outcome }
                default:
                    // A TLS 1.3 server follows its ServerHello with change_cipher_spec and encrypted records.
                    if let flight { return .serverHello(flight) }
                    return .malformed("record type \(type) before a ServerHello")
                }
            }
            return nil
        }

        private mutating func readMessages() -> Outcome? {
            while handshake.count >= 4 {
                let type = handshake[0]
                let length = Int(handshake[1]) << 16 | Int(handshake[2]) << 8 | Int(handshake[3])
                guard handshake.count >= 4 + length else { return nil }
                let body = Array(handshake[4..<(4 + length)])
                handshake.removeFirst(4 + length)
                switch type {
                case 2:  // ServerHello: version, random(32), session id<0..32>, suite, compression
                    guard body.count >= 35, body.count >= 38 + Int(body[34]) else { return .malformed("short ServerHello") }
                    let suiteAt = 35 + Int(body[34])
                    flight = ServerFlight(version: UInt16(body[0]) << 8 | UInt16(body[1]),
                                          cipherSuite: UInt16(body[suiteAt]) << 8 | UInt16(body[suiteAt + 1]),
                                          compressionMethod: body[suiteAt + 2],
                                          extensions: TLSHelloProbe.extensionTypes(body.dropFirst(suiteAt + 3)))
                case 12:  // ServerKeyExchange
                    guard flight != nil else { return .malformed("ServerKeyExchange before ServerHello") }
                    var reader = VectorReader(bytes: body)
                    guard let hint = reader.next(), let prime = reader.next(), let generator = reader.next(),
                          let serverPublic = reader.next() else {
                        return .malformed("ServerKeyExchange is not DHE-PSK (hint, p, g, Ys)")
                    }
                    flight?.keyExchange = DHEKeyExchange(identityHint: hint, prime: prime, generator: generator,
                                                         serverPublic: serverPublic)
                case 14:  // ServerHelloDone
                    guard let flight else { return .malformed("ServerHelloDone before ServerHello") }
                    return .serverHello(flight)
                default:
                    continue
                }
            }
            return nil
        }
    }

    /// The types of an extensions block (`length ‖ (type ‖ length ‖ data)*`); stops at the first damage.
    static func extensionTypes(_ block: ArraySlice<UInt8>) -> [UInt16] {
        let bytes = Array(block)
        guard bytes.count >= 2 else { return [] }
        var types: [UInt16] = []
        var offset = 2
        let end = min(bytes.count, 2 + (Int(bytes[0]) << 8 | Int(bytes[1])))
        while offset + 4 <= end {
            types.append(UInt16(bytes[offset]) << 8 | UInt16(bytes[offset + 1]))
            offset += 4 + (Int(bytes[offset + 2]) << 8 | Int(bytes[offset + 3]))
        }
        return types
    }

    private struct VectorReader {
        var bytes: [UInt8]
        var offset = 0
        mutating func next() -> [UInt8]? {
            guard offset + 2 <= bytes.count else { return nil }
            let length = Int(bytes[offset]) << 8 | Int(bytes[offset + 1])
            guard offset + 2 + length <= bytes.count else { return nil }
            defer { offset += 2 + length }
            return Array(bytes[(offset + 2)..<(offset + 2 + length)])
        }
    }

    private static func randomBytes(_ count: Int) -> [UInt8] { (0..<count).map { _ in UInt8.random(in: .min ... .max) } }
    private static func u16(_ value: UInt16) -> [UInt8] { [UInt8(value >> 8), UInt8(value & 0xFF)] }
    private static func u16(_ value: Int) -> [UInt8] { u16(UInt16(clamping: value)) }
    private static func u24(_ value: Int) -> [UInt8] { [UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF)] }
    private static func u16list(_ values: [UInt16]) -> [UInt8] { u16(values.count * 2) + values.flatMap { u16($0) } }
    private static func ext(_ type: UInt16, _ data: [UInt8]) -> [UInt8] { u16(type) + u16(data.count) + data }
}

/// Names of the TLS alerts a case may see.
func alertName(_ code: UInt8) -> String {
    switch code {
    case 10: "unexpected_message"
    case 20: "bad_record_mac"
    case 40: "handshake_failure"
    case 47: "illegal_parameter"
    case 50: "decode_error"
    case 51: "decrypt_error"
    case 70: "protocol_version"
    case 71: "insufficient_security"
    case 80: "internal_error"
    case 115: "unknown_psk_identity"
    default: "alert(\(code))"
    }
}

func hex16(_ value: UInt16) -> String { Hex.encode([UInt8(value >> 8), UInt8(value & 0xFF)]) }
