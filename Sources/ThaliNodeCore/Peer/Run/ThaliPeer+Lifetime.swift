import Foundation
import NIOCore

/// The peer's lifetime: its timers (deadlines of ``PeerSchedule``, fired from ``PeerLifetime``'s one
/// sleeper) and its stop (the steps of ``PeerLifecycle/StopStep``, in their order, once).
extension ThaliPeer {
    // MARK: Timers

    /// Arms `timer` for `delay` from now (replacing its earlier deadline) and tells the lifetime's clock.
    func arm(_ timer: PeerSchedule<ContinuousClock.Instant>.Timer, after delay: Duration) {
        let deadline = ContinuousClock.now + delay
        let armed = state.withLockedValue { state -> Bool in
            guard !state.stopped else { return false }
            state.schedule.arm(timer, at: deadline)
            return true
        }
        if armed { lifetime.wake(at: deadline) }
    }

    /// The lifetime's clock reached a deadline: fires every timer due.
    func deadlinesReached() {
        let now = ContinuousClock.now
        let due = state.withLockedValue { $0.stopped ? [] : $0.schedule.takeDue(at: now) }
        for timer in due {
            switch timer {
            case .rotateAnnouncement:
                lifetime.run { [self] in
                    await rotateAnnouncement()
                    arm(.rotateAnnouncement, after: configuration.announcementRotationInterval)
                }
            case .checkStore:
                lifetime.run { [self] in
                    state.withLockedValue { $0.storeChangedDuringCheck = false }
                    await checkStore()
                    let again = state.withLockedValue { $0.storeChangedDuringCheck }
                    arm(.checkStore, after: again ? .zero : configuration.outboxPollInterval)
                }
            case .linkBackoff(let key):
                let contact = state.withLockedValue { state -> Contact? in
                    state.links[key]?.machine.backoffEnded()
                    return state.links[key]?.contact
                }
                if let contact { lifetime.run { [self] in await runLink(contact) } }
            case .reopenPort:
                lifetime.run { [self] in await reopenPort() }
            case .pacedAnnouncement:
                lifetime.run { [self] in
                    do {
                        try await refreshAdvertisement()
                    } catch is CancellationError {
                        // The peer is stopping.
                    } catch {
                        logger.error("announcing a new item failed", metadata: ["error": "\(error)"])
                    }
                }
            }
        }
        // A timer armed meanwhile told the clock itself; one armed earlier and not yet due needs it again.
        if let next = state.withLockedValue({ $0.schedule.nextDeadline }) { lifetime.wake(at: next) }
    }

    /// Reads the store if anything was committed since the last read (by this process or another: `send`),
    /// or if time alone asks for a new announcement. Reading it is several queries and a write (the expiry
    /// sweep): every second in every peer, a crowd in one process spent a quarter of its CPU there; the
    /// change stamp is two `stat`s.
    private func checkStore() async {
        let stamp = store.changeStamp()
        let lastRead = state.withLockedValue { $0.lastStoreStamp }
        guard stamp != lastRead || advertisementDueByTime() else { return }
        // A stamp taken just after a commit may not differ from the next one's: read again then.
        state.withLockedValue { $0.lastStoreStamp = stamp.isSettled() ? stamp : nil }
        do {
            try await refreshAddressBook()
            try await refreshAdvertisement()
        } catch is CancellationError {
            return  // the peer is stopping: its work on the thread pool was not started
        } catch {
            state.withLockedValue { $0.lastStoreStamp = nil }
            logger.error("reading the store failed", metadata: ["error": "\(error)"])
        }
    }

    // MARK: Stop

    /// Stops: byebye (no more announcements), every connection closed, every task ended, in the order of
    /// the lifecycle's stop steps. A stop during ``start()`` waits for it to end; a second stop waits for
    /// the first.
    public func stop() async {
        while true {
            switch state.withLockedValue({ $0.lifecycle.stop() }) {
            case .perform(let steps):
                for step in steps { await perform(step) }
                state.withLockedValue { $0.lifecycle.stopFinished() }
                stopEnded.signal()
                return
            case .waitForStart:
                await startEnded.wait()
            case .waitForStop:
                await stopEnded.wait()
                return
            case .none:
                return
            }
        }
    }

    private func perform(_ step: PeerLifecycle.StopStep) async {
        switch step {
        case .refuseNewWork:
            state.withLockedValue { state in
                state.schedule.disarmAll()
                for key in state.links.keys { state.links[key]?.machine.stopped() }
            }
            finishStreamHandlers()
        case .stopBindings:
            stopFollowingInterface()
            for binding in bindings { await binding.stop() }
        case .closePort:
            await closePort()
        case .closeConnections:
            let channels = state.withLockedValue { state -> [Channel] in
                defer { state.channels.removeAll() }
                return Array(state.channels.values)
            }
            for channel in channels { channel.close(promise: nil) }
        case .endTasks:
            await lifetime.end()
        case .releaseDirectory:
            heldLock.withLockedValue { $0 = nil }  // the last reference: closing it releases the directory
        case .reportStopped:
            emit(.stopped)
        }
    }
}
