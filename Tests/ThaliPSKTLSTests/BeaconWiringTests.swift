import NIOCore
import Testing
import ThaliBeacons
import ThaliPSKTLS

/// End to end with ThaliBeacons: A advertises beacons for B; B parses them and connects with the
/// identity and PSK of the beacon it matched; A's server accepts through its table of advertised PSKs.
/// ThaliPSKTLS knows nothing of beacons: the wiring is the lookup closure and two strings of bytes.
extension PSKTLSTests {
    @Suite struct BeaconWiringTests {
        @Test func bConnectsToAWithTheIdentityAndPSKOfTheBeaconItMatched() async throws {
            try await expectNoLeaks {
                let a = PrivateKey()
                let b = PrivateKey()
                let bystander = PrivateKey()
                // A advertises for B (and someone else) and remembers what it advertised.
                let announcement = try BeaconGenerator(identity: a)
                    .makeAnnouncement(for: [bystander.publicKey, b.publicKey], validity: .seconds(60))
                let table = AdvertisedPSKTable()
                table.register(announcement)
                let server = try await PSKTLSServer.serve(host: "127.0.0.1", port: 0) { identity in
                    table.lookup(identity: identity)?.psk
                }

                // B knows A, finds its beacon in the stream and derives the same identity and PSK.
                let receiver = BeaconReceiver(identity: b)
                try receiver.addressBook.add(a.publicKey)
                let match = try receiver.receive(announcement.stream)
                #expect(match.sender == a.publicKey)
                #expect(match.pskIdentity.count == 192)

                let connection = try await PSKTLSClient.connect(
                    host: "127.0.0.1", port: server.port, identity: match.pskIdentity, psk: match.psk)
                var connections = server.connections.makeAsyncIterator()
                let accepted = try #require(await connections.next())
                #expect(accepted.parameters.dhGroupBits == 3072)
                // A learns from the identity which contact connected: B.
                #expect(table.lookup(identity: accepted.parameters.pskIdentity)?.contact == b.publicKey)

                async let served: Void = accepted.executeThenClose { inbound, outbound in
                    var iterator = inbound.makeAsyncIterator()
                    let request = try await readBytes(&iterator, count: 5)
                    #expect(request == Array("hello".utf8))
                    try await outbound.write(ByteBuffer(string: "hello, B"))
                }
                try await connection.executeThenClose { inbound, outbound in
                    try await outbound.write(ByteBuffer(string: "hello"))
                    var iterator = inbound.makeAsyncIterator()
                    #expect(try await readAll(&iterator) == Array("hello, B".utf8))
                }
                try await served
                await server.close()
            }
        }

        @Test func anIdentityFromAnExpiredAnnouncementIsRefused() async throws {
            try await expectNoLeaks {
                let a = PrivateKey()
                let b = PrivateKey()
                let announcement = try BeaconGenerator(identity: a)
                    .makeAnnouncement(for: [b.publicKey], validity: .seconds(60))
                // A's table reads a clock the test can move past the announcement's expiration.
                let skew = ManagedCounter()
                let table = AdvertisedPSKTable(clock: BeaconClock { BeaconClock.system.now() + UInt64(skew.value) })
                table.register(announcement)
                let server = try await PSKTLSServer.serve(host: "127.0.0.1", port: 0) { identity in
                    table.lookup(identity: identity)?.psk
                }
                let receiver = BeaconReceiver(identity: b)
                try receiver.addressBook.add(a.publicKey)
                let match = try receiver.receive(announcement.stream)
                #expect(table.lookup(identity: match.pskIdentity)?.contact == b.publicKey)

                // B answers too late: for A, the announcement has expired.
                skew.add(61_000)
                let error = await #expect(throws: PSKTLSError.self) {
                    _ = try await PSKTLSClient.connect(
                        host: "127.0.0.1", port: server.port, identity: match.pskIdentity, psk: match.psk)
                }
                #expect(error?.reason == .alertReceived(.unknownPSKIdentity))
                var failures = server.handshakeFailures.makeAsyncIterator()
                #expect(await failures.next()?.reason == .alertSent(.unknownPSKIdentity))
                await server.close()
            }
        }
    }
}
