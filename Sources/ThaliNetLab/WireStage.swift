import CNetLabTap
import ThaliSupport
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The lab's wire: one thread that reads every Ethernet frame from each TAP device and writes it to the
/// others through the profile's ``LinkDirection`` for that pair of ports (a learning switch: unicast to a
/// known address goes to its port only; multicast, broadcast and unknown destinations go to every other
/// port). Frames waiting for their release time sit in one FIFO per direction (releases are monotonic
/// within a direction, so the next timer is the earliest head of a few FIFOs); the thread sleeps in
/// `ppoll` until a device is readable or the earliest release is due, with 1 µs timer slack.
///
/// Limits: frames up to ``maximumFrameBytes``; at most ``maximumFramesInFlight`` frames waiting per
/// direction (more are dropped and counted); at most ``readBurst`` frames read from one device before
/// the others get a turn.
public final class WireStage: @unchecked Sendable {
    /// The largest frame read (a TAP device without offloads gives at most its MTU plus 14 bytes).
    public static let maximumFrameBytes = 65_536
    /// The most frames waiting for their release time in one direction; beyond it frames are dropped as
    /// ``LinkDrop/inFlightLimit`` (with a rate, the profile's queue bound is reached long before).
    public static let maximumFramesInFlight = 8_192
    /// The most frames read from one device in a row before the others are served.
    public static let readBurst = 64
    /// The thread's timer slack, in nanoseconds (the kernel's default of 50 µs would add to every delay).
    public static let timerSlackNanoseconds: UInt = 1_000
    /// The most MAC addresses the switch learns; beyond it unknown destinations are flooded.
    public static let maximumLearnedAddresses = 1_024

    private let ports: [Int32]
    private let profile: LinkProfile
    private let seed: UInt64
    private let wake: (read: Int32, write: Int32)
    private let lock = NSLock()
    private var published = LinkCounters()
    private var publishedOutages = 0
    private var publishedMalformed = 0
    private let finished = DispatchSemaphore(value: 0)
    private var running = false

    /// A stage between the TAP descriptors `ports` (non-blocking; not closed by the stage), applying
    /// `profile` in every direction, its random draws from `seed`.
    public init(ports: [Int32], profile: LinkProfile, seed: UInt64) throws(NetLabError) {
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else { throw .system("pipe", errno) }
        for end in pipeEnds {
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
            _ = fcntl(end, F_SETFL, O_NONBLOCK)
        }
        self.ports = ports
        self.profile = profile
        self.seed = seed
        wake = (pipeEnds[0], pipeEnds[1])
    }

    deinit {
        close(wake.read)
        close(wake.write)
    }

    /// Starts the forwarding thread.
    public func start() {
        lock.withLock { running = true }
        let thread = Thread { [self] in
            forward()
            finished.signal()
        }
        thread.name = "netlab wire"
        thread.start()
    }

    /// Stops the forwarding thread and waits for it (frames still waiting are dropped). Idempotent.
    public func stop() {
        guard lock.withLock({ () -> Bool in
            defer { running = false }
            return running
        }) else { return }
        var byte: UInt8 = 1
        _ = write(wake.write, &byte, 1)
        finished.wait()
    }

    /// What the stage did so far, every direction summed (updated after each batch of frames). A frame whose
    /// release falls in an outage counts as passed by its direction and as dropped (`link_down`) by the stage.
    public var counters: LinkCounters { lock.withLock { published } }
    /// Outages (flaps) the stage has applied so far.
    public var outages: Int { lock.withLock { publishedOutages } }
    /// Frames too short to hold an Ethernet header (dropped).
    public var malformedFrames: Int { lock.withLock { publishedMalformed } }

    private static func monotonicNow() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
    }

    /// A direction's frames waiting for their release time, oldest first.
    private struct Waiting {
        var frames: [(release: Int64, bytes: [UInt8])] = []
        var head = 0
        var count: Int { frames.count - head }
        mutating func append(_ release: Int64, _ bytes: [UInt8]) { frames.append((release, bytes)) }
        var first: (release: Int64, bytes: [UInt8])? { head < frames.count ? frames[head] : nil }
        mutating func removeFirst() {
            head += 1
            if head == frames.count {
                frames.removeAll(keepingCapacity: true)
                head = 0
            } else if head >= 1024 && head * 2 >= frames.count {
                frames.removeFirst(head)
                head = 0
            }
        }
    }

    private func forward() {
        _ = cnetlab_set_timer_slack(UInt(Self.timerSlackNanoseconds))
        var random = SplitMix64(state: seed)
        let count = ports.count
        var directions = (0..<count).map { _ in (0..<count).map { _ in LinkDirection(profile: profile) } }
        var waiting = (0..<count).map { _ in (0..<count).map { _ in Waiting() } }
        var stageCounters = LinkCounters()  // the stage's own drops (in-flight limit, failed writes)
        var flaps = profile.flaps.map { FlapSchedule(pattern: $0, start: Self.monotonicNow(), using: &random) }
        var learned: [UInt64: Int] = [:]
        var malformed = 0
        var pollSet = ports.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        pollSet.append(pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0))
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Self.maximumFrameBytes, alignment: 16)
        defer { buffer.deallocate() }

        func publish() {
            var total = stageCounters
            for row in directions { for direction in row { total.add(direction.counters) } }
            let outages = flaps?.outagesSeen ?? 0
            lock.withLock {
                published = total
                publishedOutages = outages
                publishedMalformed = malformed
            }
        }
        func send(_ bytes: UnsafeRawBufferPointer, to port: Int) {
            var written: Int
            repeat { written = write(ports[port], bytes.baseAddress, bytes.count) } while written < 0 && errno == EINTR
            if written != bytes.count { stageCounters.dropped[.writeFailed, default: 0] += 1 }
        }

        while true {
            var now = Self.monotonicNow()
            var next = Int64.max
            for from in 0..<count {
                for to in 0..<count where waiting[from][to].count > 0 {
                    while let first = waiting[from][to].first, first.release <= now {
                        waiting[from][to].removeFirst()
                        if flaps?.isDown(at: now, using: &random) == true {
                            stageCounters.dropped[.linkDown, default: 0] += 1
                        } else {
                            first.bytes.withUnsafeBytes { send($0, to: to) }
                        }
                    }
                    if let first = waiting[from][to].first { next = min(next, first.release) }
                }
            }
            for index in pollSet.indices { pollSet[index].revents = 0 }
            let timeout = next == .max ? -1 : max(0, next - now)
            let ready = pollSet.withUnsafeMutableBufferPointer { cnetlab_poll($0.baseAddress, $0.count, timeout) }
            if ready < 0 && errno != EINTR { break }
            if pollSet[count].revents != 0 { break }
            guard ready > 0 else { continue }
            for from in 0..<count where pollSet[from].revents != 0 {
                if pollSet[from].revents & Int16(POLLIN) == 0 {
                    pollSet[from].fd = -1  // the device is gone (POLLERR, POLLHUP): stop polling it
                    continue
                }
                for _ in 0..<Self.readBurst {
                    let length = read(ports[from], buffer.baseAddress, buffer.count)
                    if length < 0 {
                        if errno == EINTR { continue }
                        break  // EAGAIN: drained; anything else: tried again at the next poll
                    }
                    if length == 0 { break }
                    let frame = UnsafeRawBufferPointer(rebasing: buffer[..<length])
                    guard let header = try? EthernetHeader(frame) else {
                        malformed += 1
                        continue
                    }
                    now = Self.monotonicNow()
                    if !EthernetHeader.isGroup(header.source),
                       learned[header.source] != nil || learned.count < Self.maximumLearnedAddresses {
                        learned[header.source] = from
                    }
                    let targets: [Int]
                    if !header.isGroupDestination, let port = learned[header.destination] {
                        targets = port == from ? [] : [port]
                    } else {
                        targets = (0..<count).filter { $0 != from }
                    }
                    let down = flaps?.isDown(at: now, using: &random) ?? false
                    for to in targets {
                        switch directions[from][to].admit(bytes: length, multicast: header.isMulticast, linkDown: down, now: now,
                                                          using: &random) {
                        case .drop:
                            break
                        case .deliver(let release):
                            if release <= now && waiting[from][to].count == 0 {
                                send(frame, to: to)
                            } else if waiting[from][to].count >= Self.maximumFramesInFlight {
                                stageCounters.dropped[.inFlightLimit, default: 0] += 1
                            } else {
                                waiting[from][to].append(release, Array(frame))
                            }
                        }
                    }
                }
            }
            publish()
        }
        publish()
    }
}

/// A lab step that failed: a system call or a command.
public enum NetLabError: Error, CustomStringConvertible, Sendable {
    /// A system call failed with this errno.
    case system(String, Int32)
    /// A command failed, with its output.
    case command(String, String)
    /// The lab cannot run here (not root, no `ip`, no TUN device, a bad argument).
    case unavailable(String)

    /// What failed, in words.
    public var description: String {
        switch self {
        case .system(let call, let number): "\(call) failed: \(String(cString: strerror(number)))"
        case .command(let command, let output): "\(command) failed: \(output)"
        case .unavailable(let reason): reason
        }
    }
}
