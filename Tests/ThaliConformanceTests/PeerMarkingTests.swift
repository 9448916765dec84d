import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
import ThaliBeacons
import ThaliNodeCore
import ThaliPSKTLS
import ThaliSSDP

@testable import ThaliConformance

/// Peer mode's stream-marking cases against two in-process implementations on loopback (real PSK-TLS,
/// real yamux): one from before marking, which selects no ALPN protocol, and one that marks sessions but
/// answers every header with acceptance, whatever its kind.
@Suite("Conformance peer mode: stream marking against broken implementations")
struct PeerMarkingTests {
    static let identity = "thali-conformance-test-identity"
    static let psk: [UInt8] = Array(0..<32)

    /// A PSK-TLS server knowing `identity`; with `marking`, it selects `thali-streams/1` and answers every
    /// stream's first bytes with status 0 (accepted), then nothing.
    static func implementation(marking: Bool, group: EventLoopGroup) async throws -> Channel {
        var tls = PSKTLSConfiguration(dhGroup: .ffdhe2048)
        if marking { tls.applicationProtocols = [StreamHeader.alpnProtocol] }
        let context = try PSKTLSContext(role: .server, configuration: tls)
        return try await ServerBootstrap(group: group)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                AuthenticatedSession.configureServer(on: channel, context: context, lookup: { identity in
                    identity == Self.identity ? (psk: Self.psk, peer: identity) : nil
                }, inboundStream: { (stream: Channel, _: String) in
                    var accepted = stream.allocator.buffer(capacity: 2)
                    StreamStatus.accepted.encode(into: &accepted)
                    return stream.writeAndFlush(accepted)
                }).map { _ in }
            }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    static func grade(_ server: Channel, group: EventLoopGroup) async throws -> ConformanceReport {
        var configuration = PeerConformanceConfiguration(peerKey: PrivateKey().publicKey, identity: PrivateKey(), address: "127.0.0.1")
        configuration.stepTimeout = .seconds(2)
        let location = BeaconLocation(host: "127.0.0.1", port: try #require(server.localAddress?.port))
        let match = BeaconMatch(sender: configuration.peerKey, beaconIndex: 0, pskIdentity: identity, psk: psk,
                                expiration: DeliveryClock.nowMilliseconds + 600_000)
        let run = ConformanceRun(target: "in-process", catalog: try RequirementCatalog.load(from: RequirementCatalog.defaultPath))
        await PeerConformance(configuration: configuration, group: group).markingCases(run, location: location, match: match)
        return run.report
    }

    @Test("one from before marking: alpn-selected and every marking case UNSUPPORTED (a MUST case never grades WARN)")
    func unmarkedImplementation() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await Self.implementation(marking: false, group: group)
        defer { server.close(promise: nil) }
        let report = try await Self.grade(server, group: group)
        let alpn = try #require(report.result(PeerConformance.Cases.alpnSelected.id))
        #expect(alpn.verdict == .unsupported && alpn.actual.contains("no protocol selected"), "\(report.table)")
        for testCase in PeerConformance.Cases.marking.dropFirst() {
            #expect(report.result(testCase.id)?.verdict == .unsupported, "\(testCase.id)\n\(report.table)")
        }
        #expect(report.unexpectedMustFailures.isEmpty)
    }

    @Test("one that accepts every header: the unknown kind, the malformed headers and the unserved app protocol FAIL")
    func acceptsEveryHeader() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await Self.implementation(marking: true, group: group)
        defer { server.close(promise: nil) }
        let report = try await Self.grade(server, group: group)
        #expect(report.result(PeerConformance.Cases.alpnSelected.id)?.verdict == .pass, "\(report.table)")
        for testCase in [PeerConformance.Cases.unknownKindRefused, PeerConformance.Cases.badHeaderRefused, PeerConformance.Cases.appNotServed] {
            let result = try #require(report.result(testCase.id))
            #expect(result.verdict == .fail && result.actual.contains("status accepted"), "\(testCase.id)\n\(report.table)")
        }
        // Accepted, but no sender speaks: no hello within the step timeout.
        #expect(report.result(PeerConformance.Cases.deliveryAccepted.id)?.verdict == .fail, "\(report.table)")
    }
}
