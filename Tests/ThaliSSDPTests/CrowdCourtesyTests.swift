import NIOCore
import NIOPosix
import Testing

@testable import ThaliSSDP

/// What keeps a crowd of honest peers out of each other's last resorts (issue 24): a busy beacon server
/// answers a cheap "later" that the fetcher honours without counting a failure (`spec/ssdp.md` 6.1), and
/// a peer whose beacons matched a contact keeps its place and its fetches ahead of strangers when the
/// table narrows (7.2).
@Suite("Busy answers and contacts first", .serialized)
struct CrowdCourtesyTests {
    let group = MultiThreadedEventLoopGroup.singleton
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    /// A server whose first request in a window fills its busy budget.
    func busyServer(host: String, window: Duration, retryAfter: Duration) -> BeaconHTTPServer {
        var limits = BeaconHTTPServerLimits()
        limits.busyRequestsGlobal = 1
        limits.globalWindow = window
        limits.maxBusyRetryAfter = retryAfter
        return BeaconHTTPServer(host: host, limits: limits, group: group)
    }

    @Test("a server past its busy budget answers 503 with Retry-After, and the client reports busy after one attempt")
    func aBusyServerAnswersLater() async throws {
        let server = busyServer(host: "127.0.0.1", window: .seconds(30), retryAfter: .seconds(3))
        server.setBeacons([1, 2, 3])
        let location = BeaconLocation(host: "127.0.0.1", port: try await server.start())
        let client = BeaconHTTPClient(group: group)
        #expect(try await client.fetch(location) == [1, 2, 3])
        do {
            let bytes = try await client.fetch(location)
            Issue.record("served while busy: \(bytes)")
        } catch {
            guard case .busy(let wait) = error.reason else { throw error }
            #expect((1...3).contains(wait.components.seconds), "Retry-After within 1...maxBusyRetryAfter: \(wait)")
            #expect(error.attempts == 1, "a busy answer is not retried at once")
        }
        #expect(server.counters.answeredBusy == 1)
        #expect(server.counters.requestsAnswered == 1, "the busy answer served no stream")
        #expect(server.admissionCounters.busyAnswers == 1)
        await server.stop()
    }

    @Test("Retry-After is read as whole seconds, bounded; anything else is the default wait")
    func retryAfterIsBounded() {
        let wait = BeaconHTTPClientConfiguration().busyWait
        #expect(wait("7") == .seconds(7))
        #expect(wait(" 2 ") == .seconds(2))
        #expect(wait(nil) == .seconds(5))
        #expect(wait("Wed, 21 Oct 2015 07:28:00 GMT") == .seconds(5))
        #expect(wait("-3") == .seconds(5))
        #expect(wait("99999999999") == .seconds(60), "a day is cut to maxBusyRetryAfter")
    }

    @Test("a full table keeps a contact's peer: strangers take each other's places, and a new contact takes an unread stranger's")
    func contactsKeepTheirPlaces() {
        func location(_ index: Int) -> BeaconLocation { BeaconLocation(host: "10.77.0.\(index)", port: 1000) }
        var table = PeerTable(maxPeers: 2, byebyeGrace: .milliseconds(300), maxContactSources: 2)
        _ = table.alive(serviceName: "uuid:c", location: location(1), maxAge: 60, now: start)
        _ = table.fetched(serviceName: "uuid:c", result: .fetched([1]), now: start)
        table.markContact(host: location(1).host)
        _ = table.alive(serviceName: "uuid:s1", location: location(2), maxAge: 60, now: start)
        _ = table.fetched(serviceName: "uuid:s1", result: .fetched([2]), now: start)
        // The contact was read first, yet the stranger gives up its place.
        let actions = table.alive(serviceName: "uuid:s2", location: location(3), maxAge: 60, now: start)
        #expect(actions.first == .emit(.left(SSDPPeer(location: location(2), uniqueServiceName: "uuid:s1", beaconState: .fetched([2])),
                                             reason: .narrowed)))
        // Only the contact is read now: another stranger waits, the contact stays.
        #expect(table.alive(serviceName: "uuid:s3", location: location(4), maxAge: 60, now: start) == [.capExceeded])
        #expect(table.tracks(location(1)) && table.isContact(location(1)))
        // A contact's new location, with no read stranger left, takes an unread stranger's place.
        table.markContact(host: location(5).host)
        let contact = table.alive(serviceName: "uuid:c2", location: location(5), maxAge: 60, now: start)
        #expect(contact.first == .emit(.left(SSDPPeer(location: location(3), uniqueServiceName: "uuid:s2", beaconState: .fetching),
                                             reason: .narrowed)))
        #expect(contact.last == .fetch(location(5), serviceName: "uuid:c2"))
        // The memory of contact sources is bounded (two here): the oldest is forgotten first.
        table.markContact(host: location(6).host)
        #expect(!table.isContact(location(1)) && table.isContact(location(5)) && table.isContact(location(6)))
    }
}
