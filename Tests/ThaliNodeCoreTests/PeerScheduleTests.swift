import Testing
@testable import ThaliNodeCore

/// An instant of a clock that moves only when a test says: the schedule's tests take no time.
struct VirtualInstant: InstantProtocol {
    var offset: Duration

    static let zero = VirtualInstant(offset: .zero)

    func advanced(by duration: Duration) -> VirtualInstant { VirtualInstant(offset: offset + duration) }
    func duration(to other: VirtualInstant) -> Duration { other.offset - offset }
    static func < (lhs: VirtualInstant, rhs: VirtualInstant) -> Bool { lhs.offset < rhs.offset }
    static func + (lhs: VirtualInstant, rhs: Duration) -> VirtualInstant { lhs.advanced(by: rhs) }
}

/// The peer's timers as deadlines, on a virtual clock: what fires when, in which order, and what a
/// disarmed or re-armed timer does.
@Suite struct PeerScheduleTests {
    typealias Schedule = PeerSchedule<VirtualInstant>
    let t0 = VirtualInstant.zero

    @Test func nothingIsDueBeforeItsDeadlineAndEverythingDueFiresOnceEarliestFirst() {
        var schedule = Schedule()
        schedule.arm(.rotateAnnouncement, at: t0 + .seconds(10))
        schedule.arm(.checkStore, at: t0 + .seconds(1))
        schedule.arm(.linkBackoff(contactKey: "02aa"), at: t0 + .seconds(4))
        #expect(schedule.nextDeadline == t0 + .seconds(1))
        let r1 = schedule.takeDue(at: t0 + .milliseconds(999))
        #expect(r1.isEmpty)
        let r2 = schedule.takeDue(at: t0 + .seconds(5))
        #expect(r2 == [.checkStore, .linkBackoff(contactKey: "02aa")])
        let r3 = schedule.takeDue(at: t0 + .seconds(5))
        #expect(r3.isEmpty, "a timer fires once per arming")
        #expect(schedule.nextDeadline == t0 + .seconds(10))
        let r4 = schedule.takeDue(at: t0 + .seconds(10))
        #expect(r4 == [.rotateAnnouncement])
        #expect(schedule.nextDeadline == nil)
    }

    @Test func timersDueAtTheSameInstantFireInTheOrderTheyWereArmed() {
        var schedule = Schedule()
        let keys = ["02cc", "02aa", "02bb"]
        for key in keys { schedule.arm(.linkBackoff(contactKey: key), at: t0 + .seconds(2)) }
        schedule.arm(.reopenPort, at: t0 + .seconds(2))
        let r5 = schedule.takeDue(at: t0 + .seconds(2))
        #expect(r5 == keys.map { .linkBackoff(contactKey: $0) } + [.reopenPort])
    }

    @Test func armingAgainReplacesTheDeadline() {
        var schedule = Schedule()
        schedule.arm(.checkStore, at: t0 + .seconds(1))
        schedule.arm(.checkStore, at: t0 + .seconds(3))
        #expect(schedule.deadline(of: .checkStore) == t0 + .seconds(3))
        let r6 = schedule.takeDue(at: t0 + .seconds(2))
        #expect(r6.isEmpty)
        let r7 = schedule.takeDue(at: t0 + .seconds(3))
        #expect(r7 == [.checkStore])
    }

    @Test func aDisarmedBackoffNeverFires() {
        // A match ends a link's backoff early: the peer disarms it and starts the link itself.
        var schedule = Schedule()
        let backoff = Schedule.Timer.linkBackoff(contactKey: "02aa")
        schedule.arm(backoff, at: t0 + .seconds(30))
        let r8 = schedule.disarm(backoff)
        #expect(r8)
        let r9 = schedule.disarm(backoff)
        #expect(!r9, "only the first disarm finds it armed: the link starts once")
        let r10 = schedule.takeDue(at: t0 + .seconds(60))
        #expect(r10.isEmpty)
    }

    @Test func disarmingAllLeavesNothingToWakeFor() {
        var schedule = Schedule()
        schedule.arm(.rotateAnnouncement, at: t0 + .seconds(1))
        schedule.arm(.linkBackoff(contactKey: "02aa"), at: t0 + .seconds(2))
        schedule.disarmAll()
        #expect(schedule.nextDeadline == nil)
        #expect(!schedule.isArmed(.rotateAnnouncement))
    }
}

/// Start and stop as values: a peer starts once, its stop runs every step once in order, and a stop
/// meeting a start or another stop waits for it.
@Suite struct PeerLifecycleTests {
    @Test func aStopPerformsEveryStepInOrderOnce() {
        var lifecycle = PeerLifecycle()
        let r11 = lifecycle.start()
        #expect(r11 == nil)
        lifecycle.startEnded()
        #expect(lifecycle.phase == .running)
        let steps: [PeerLifecycle.StopStep] = [.refuseNewWork, .stopBindings, .closePort, .closeConnections, .endTasks,
                                               .releaseDirectory, .reportStopped]
        let r12 = lifecycle.stop()
        #expect(r12 == .perform(steps))
        #expect(lifecycle.isStopping)
        let r13 = lifecycle.stop()
        #expect(r13 == .waitForStop, "a second stop waits for the first and performs nothing")
        lifecycle.stopFinished()
        let r14 = lifecycle.stop()
        #expect(r14 == PeerLifecycle.StopDecision.none)
        let r15 = lifecycle.start()
        #expect(r15 == .stopped)
    }

    @Test func aPeerStartsOnce() {
        var lifecycle = PeerLifecycle()
        let r16 = lifecycle.start()
        #expect(r16 == nil)
        let r17 = lifecycle.start()
        #expect(r17 == .alreadyStarted)
        lifecycle.startEnded()
        let r18 = lifecycle.start()
        #expect(r18 == .alreadyStarted)
    }

    @Test func aStopDuringTheStartWaitsForIt() {
        var lifecycle = PeerLifecycle()
        let r19 = lifecycle.start()
        #expect(r19 == nil)
        let r20 = lifecycle.stop()
        #expect(r20 == .waitForStart)
        #expect(!lifecycle.isStopping, "the start goes on: it undoes nothing half-made")
        lifecycle.startEnded()
        let r21 = lifecycle.stop()
        guard case .perform = r21 else {
            Issue.record("the stop performs its steps once the start ended")
            return
        }
    }

    @Test func aPeerStoppedBeforeItStartedNeverStarts() {
        var lifecycle = PeerLifecycle()
        let r22 = lifecycle.stop()
        guard case .perform = r22 else {
            Issue.record("a stop before any start still ends the event streams")
            return
        }
        lifecycle.stopFinished()
        let r23 = lifecycle.start()
        #expect(r23 == .stopped)
    }
}
