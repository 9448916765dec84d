import Testing
import ThaliNetLab
import ThaliSupport

/// The wire's scheduler on a virtual clock (nanoseconds), with seeded random draws: what a direction of a
/// lab link does to frames, without a device or a thread.
@Suite("Lab link scheduler (virtual clock)")
struct LinkDirectionTests {
    static let millisecond: Int64 = 1_000_000

    func profile(rate: Int? = nil, delayMs: Int64 = 0, jitterMs: Int64 = 0, loss: Double = 0, multicastLoss: Double = 0,
                 queueBytes: Int = LinkProfile.defaultQueueBytes) -> LinkProfile {
        LinkProfile(name: "test", rateBitsPerSecond: rate, delayNanoseconds: delayMs * Self.millisecond,
                    jitterNanoseconds: jitterMs * Self.millisecond, loss: loss, multicastLoss: multicastLoss, queueBytes: queueBytes)
    }

    @Test("a fixed delay releases every frame exactly that much later; unshaped releases at once")
    func delay() {
        var random = SplitMix64(state: 1)
        var delayed = LinkDirection(profile: profile(delayMs: 4))
        for index in 0..<34 {
            let arrival = Int64(index) * 3 * Self.millisecond
            #expect(delayed.admit(bytes: 1500, multicast: false, linkDown: false, now: arrival, using: &random)
                    == .deliver(at: arrival + 4 * Self.millisecond))
        }
        var unshaped = LinkDirection(profile: .unshaped)
        #expect(unshaped.admit(bytes: 60, multicast: true, linkDown: false, now: 123, using: &random) == .deliver(at: 123))
        #expect(unshaped.counters.passed == 1 && unshaped.counters.droppedTotal == 0)
    }

    @Test("jitter spreads the delay over delay ± jitter and never reorders a direction")
    func jitterKeepsOrder() {
        var random = SplitMix64(state: 2)
        var direction = LinkDirection(profile: profile(delayMs: 20, jitterMs: 10))
        var previous = Int64.min
        var added: [Int64] = []
        for index in 0..<5000 {
            // Frames 0.1 ms apart: jitter would reorder them without the order rule.
            let arrival = Int64(index) * Self.millisecond / 10
            guard case .deliver(let release) = direction.admit(bytes: 100, multicast: false, linkDown: false, now: arrival,
                                                                using: &random)
            else {
                Issue.record("frame \(index) dropped without loss")
                return
            }
            #expect(release >= previous, "frame \(index) overtook the one before")
            previous = release
            added.append(release - arrival)
        }
        #expect(added.min()! >= 10 * Self.millisecond)
        #expect(added.max()! <= 30 * Self.millisecond)
        // Dense frames queue behind the latest of their predecessors: near the top of the range.
        #expect(added.max()! > 28 * Self.millisecond)
        var sparse = LinkDirection(profile: profile(delayMs: 20, jitterMs: 10))
        var spread = Set<Int64>()
        for index in 0..<200 {
            let arrival = Int64(index) * 100 * Self.millisecond  // far apart: the order rule never binds
            if case .deliver(let release) = sparse.admit(bytes: 100, multicast: false, linkDown: false, now: arrival, using: &random) {
                spread.insert((release - arrival) / Self.millisecond)
            }
        }
        #expect(spread.count >= 15, "delays seen: \(spread.sorted())")
    }

    @Test("loss and multicast loss hit their rates within statistical bounds (seeded)")
    func lossRates() {
        var random = SplitMix64(state: 3)
        var direction = LinkDirection(profile: profile(loss: 0.02, multicastLoss: 0.30))
        let frames = 20_000
        var lostUnicast = 0, lostMulticast = 0
        for index in 0..<frames {
            let now = Int64(index) * Self.millisecond
            if case .drop(let reason) = direction.admit(bytes: 200, multicast: false, linkDown: false, now: now, using: &random) {
                #expect(reason == .loss)
                lostUnicast += 1
            }
            if case .drop(let reason) = direction.admit(bytes: 200, multicast: true, linkDown: false, now: now, using: &random) {
                #expect(reason == .multicastLoss)
                lostMulticast += 1
            }
        }
        // Mean ± about 3.5 standard deviations (binomial): 400 ± 70, 6000 ± 230.
        #expect((330...470).contains(lostUnicast), "\(lostUnicast) of \(frames) unicast frames lost at 2 %")
        #expect((5770...6230).contains(lostMulticast), "\(lostMulticast) of \(frames) multicast frames lost at 30 %")
        #expect(direction.counters.dropped[.loss] == lostUnicast && direction.counters.dropped[.multicastLoss] == lostMulticast)
    }

    @Test("a rate serialises frames back to back: 1250 bytes at 10 Mbit/s take 1 ms each")
    func rate() {
        var random = SplitMix64(state: 4)
        var direction = LinkDirection(profile: profile(rate: 10_000_000, delayMs: 5))
        #expect(direction.serialisationNanoseconds(bytes: 1250) == Self.millisecond)
        for index in 1...10 {
            #expect(direction.admit(bytes: 1250, multicast: false, linkDown: false, now: 0, using: &random)
                    == .deliver(at: Int64(index) * Self.millisecond + 5 * Self.millisecond))
        }
        #expect(direction.queuedBytes(at: 0) == 12_500)
        #expect(direction.queuedBytes(at: 4 * Self.millisecond) == 7_500)
        // An idle link starts a frame at once.
        #expect(direction.admit(bytes: 1250, multicast: false, linkDown: false, now: 50 * Self.millisecond, using: &random)
                == .deliver(at: 56 * Self.millisecond))
    }

    @Test("the transmit queue holds at most its bound and drops at the tail")
    func queueBound() {
        var random = SplitMix64(state: 5)
        // 1000-byte frames at 8 Mbit/s: 1 ms each; 5000 bytes of queue.
        var direction = LinkDirection(profile: profile(rate: 8_000_000, queueBytes: 5_000))
        let verdicts = (0..<8).map { _ in direction.admit(bytes: 1000, multicast: false, linkDown: false, now: 0, using: &random) }
        #expect(Array(verdicts.prefix(5)) == (1...5).map { LinkVerdict.deliver(at: Int64($0) * Self.millisecond) })
        #expect(Array(verdicts.suffix(3)) == Array(repeating: LinkVerdict.drop(.queueFull), count: 3))
        // One frame serialised: room for one more, behind the five.
        #expect(direction.admit(bytes: 1000, multicast: false, linkDown: false, now: Self.millisecond, using: &random)
                == .deliver(at: 6 * Self.millisecond))
        #expect(direction.admit(bytes: 1000, multicast: false, linkDown: false, now: Self.millisecond, using: &random) == .drop(.queueFull))
        #expect(direction.counters.dropped[.queueFull] == 4)
    }

    @Test("a flapping link is down 2-8 s every 10-30 s, and a down link drops everything")
    func flaps() {
        var random = SplitMix64(state: 6)
        let second: Int64 = 1_000_000_000
        guard let pattern = LinkProfile.flapping.flaps else {
            Issue.record("the flapping profile has no flaps")
            return
        }
        var schedule = FlapSchedule(pattern: pattern, start: 0, using: &random)
        var outages: [Range<Int64>] = []
        var downSince: Int64?
        let step = 10 * LinkDirectionTests.millisecond
        for tick in 0...(600 * second / step) {
            let now = tick * step
            let down = schedule.isDown(at: now, using: &random)
            if down, downSince == nil { downSince = now }
            if !down, let since = downSince {
                outages.append(since..<now)
                downSince = nil
            }
        }
        #expect(outages.count >= 600 / 38 && outages.count <= 600 / 12, "\(outages.count) outages in 600 s")
        #expect(schedule.outagesSeen == outages.count + (downSince == nil ? 0 : 1))
        for outage in outages {
            let length = outage.upperBound - outage.lowerBound
            #expect(length >= 2 * second - step && length <= 8 * second + step, "an outage of \(length) ns")
        }
        for (before, after) in zip(outages, outages.dropFirst()) {
            let up = after.lowerBound - before.upperBound
            #expect(up >= 10 * second - step && up <= 30 * second + step, "up for \(up) ns between outages")
        }
        var direction = LinkDirection(profile: .flapping)
        for index in 0..<100 {
            #expect(direction.admit(bytes: 100, multicast: index % 2 == 0, linkDown: true, now: Int64(index), using: &random)
                    == .drop(.linkDown))
        }
    }

    @Test("the named profiles are issue 38's")
    func namedProfiles() {
        #expect(LinkProfile.named.map(\.name) == ["unshaped", "home-wifi", "crowded-hall", "far-link", "flapping", "roaming"])
        let far = LinkProfile.named("far-link")
        #expect(far?.rateBitsPerSecond == 5_000_000 && far?.delayNanoseconds == 60 * Self.millisecond
                && far?.jitterNanoseconds == 20 * Self.millisecond && far?.loss == 0.03 && far?.multicastLoss == 0.5)
        #expect(LinkProfile.unshaped.isUnshaped && !LinkProfile.homeWifi.isUnshaped)
        // roaming: home-wifi's link, and host 0's address replaced every 30 s.
        let roaming = LinkProfile.named("roaming")
        #expect(roaming?.addressChanges == AddressChangePattern(periodNanoseconds: 30_000_000_000, host: 0))
        #expect(roaming?.rateBitsPerSecond == LinkProfile.homeWifi.rateBitsPerSecond && roaming?.flaps == nil && roaming?.isUnshaped == false)
    }

    @Test("a roaming host goes through 24 distinct addresses, none another host's, then comes back to the first of them")
    func roamingAddresses() {
        let hosts = 0..<NetLab.hostCounts.upperBound
        #expect(NetLab.address(ofHost: 0, afterChanges: 0) == "10.77.0.1" && NetLab.address(ofHost: 2, afterChanges: 0) == "10.77.0.3")
        let cycle = 1...NetLab.roamingAddresses
        var taken: [String: Int] = [:]
        for host in hosts {
            for change in [0] + Array(cycle) {
                let address = NetLab.address(ofHost: host, afterChanges: change)
                let holder = taken.updateValue(host, forKey: address)
                #expect(holder == nil || holder == host, "\(address) shared by hosts \(holder ?? -1) and \(host)")
                let last = Int(address.split(separator: ".").last ?? "") ?? 0
                #expect((1...254).contains(last), "\(address)")
            }
            let own = Set(cycle.map { NetLab.address(ofHost: host, afterChanges: $0) })
            #expect(own.count == NetLab.roamingAddresses && !own.contains(NetLab.address(ofHost: host, afterChanges: 0)))
            #expect(NetLab.address(ofHost: host, afterChanges: NetLab.roamingAddresses + 1) == NetLab.address(ofHost: host, afterChanges: 1))
        }
    }

    @Test("the Ethernet header: addresses, EtherType, multicast without broadcast, and a typed error when short")
    func ethernetHeader() throws {
        let ssdp: [UInt8] = [0x01, 0x00, 0x5E, 0x7F, 0xFF, 0xFA, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00, 0x45]
        let header = try EthernetHeader(ssdp)
        #expect(header.destination == 0x0100_5E7F_FFFA && header.source == 0x0200_0000_0002 && header.etherType == 0x0800)
        #expect(header.isMulticast && header.isGroupDestination)
        let arp = try EthernetHeader([UInt8](repeating: 0xFF, count: 6) + [2, 0, 0, 0, 0, 1, 0x08, 0x06])
        #expect(!arp.isMulticast && arp.isGroupDestination)
        #expect(!(try EthernetHeader([2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 8, 0])).isGroupDestination)
        #expect(throws: EthernetHeaderError.tooShort(13)) { try EthernetHeader(Array(ssdp.prefix(13))) }
    }
}
