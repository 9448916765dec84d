import NIOCore
import NIOEmbedded
import Testing
@testable import TCPMultiplexer

/// Random, mutated and truncated input into both framings: never a crash; the session either stays
/// usable or ends with a typed error, and its buffers stay within their limits.
@Suite(.timeLimit(.minutes(2))) struct FuzzTests {
    /// A reproducible random source (SplitMix64).
    struct Seeded: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    /// Plausible traffic to mutate: stream opens, data, window updates, FIN, RST, pings, GoAway.
    func validTraffic(_ framing: MultiplexerFraming, _ rng: inout Seeded) -> ByteBuffer {
        var wire = ByteBuffer()
        for _ in 0..<Int.random(in: 1...12, using: &rng) {
            let id = UInt32.random(in: 0...6, using: &rng) * 2 + 1
            let payload = [UInt8](repeating: 0x41, count: Int.random(in: 0...300, using: &rng))
            switch framing {
            case .yamux:
                let type = YamuxHeader.FrameType(rawValue: UInt8.random(in: 0...3, using: &rng))!
                let flags = YamuxHeader.Flags(rawValue: UInt16.random(in: 0...15, using: &rng))
                let length = type == .data ? UInt32(payload.count) : UInt32.random(in: 0...1 << 20, using: &rng)
                YamuxHeader(type: type, flags: flags, streamID: type == .ping || type == .goAway ? 0 : id,
                            length: length).write(to: &wire)
                if type == .data { wire.writeBytes(payload) }
            case .thaliMultiplex:
                let flag = ThaliMultiplexHeader.Flag(rawValue: UInt8.random(in: 0...6, using: &rng))!
                ThaliMultiplexHeader(streamID: UInt64(id), flag: flag, length: payload.count).write(to: &wire)
                wire.writeBytes(payload)
            }
        }
        return wire
    }

    @Test(arguments: MultiplexerFraming.allCases)
    func garbageNeverCrashesAndEndsInATypedErrorOrACleanState(framing: MultiplexerFraming) throws {
        var rng = Seeded(state: framing == .yamux ? 1 : 2)
        var typedErrors = 0, survived = 0
        for round in 0..<400 {
            var configuration = quietConfiguration(framing)
            configuration.maxStreamReceiveBuffer = 4096
            configuration.maxFrameSize = 8192
            let accepted = AcceptedStreams(autoRead: round % 2 == 0)
            let (channel, session) = try EmbeddedChannel.withSession(
                role: .server, configuration: configuration, initializer: accepted.initializer)
            var input = validTraffic(framing, &rng)
            switch round % 4 {
            case 0:  // pure noise
                input.clear()
                for _ in 0..<Int.random(in: 1...200, using: &rng) { input.writeInteger(UInt8.random(in: 0...255, using: &rng)) }
            case 1:  // flipped bytes
                for _ in 0..<Int.random(in: 1...4, using: &rng) where input.readableBytes > 0 {
                    let at = input.readerIndex + Int.random(in: 0..<input.readableBytes, using: &rng)
                    input.setInteger(UInt8.random(in: 0...255, using: &rng), at: at)
                }
            case 2:  // truncated
                input = input.getSlice(at: input.readerIndex, length: Int.random(in: 0...input.readableBytes, using: &rng))!
            default:  // valid-looking frames as they are
                break
            }
            // Fed in random pieces.
            var failure: Error?
            while input.readableBytes > 0 && failure == nil {
                let piece = input.readSlice(length: Int.random(in: 1...input.readableBytes, using: &rng))!
                do { try channel.writeInbound(piece) } catch { failure = error }
            }
            if let failure {
                #expect(failure is MultiplexerError, "round \(round): \(failure)")
                #expect(!channel.isActive)
                typedErrors += 1
            } else {
                #expect(channel.isActive)
                let metrics = try session.metrics().wait()
                #expect(metrics.bufferedReceiveBytes <= max(configuration.maxStreamReceiveBuffer, YamuxHeader.initialWindowSize) * max(metrics.openStreams, 1))
                survived += 1
            }
            _ = try? channel.finish()
        }
        // Both outcomes happen, so the test exercises both paths.
        #expect(typedErrors > 0 && survived > 0)
    }
}
