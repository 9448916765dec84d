import Testing
@testable import TCPMultiplexer

/// The stream channel's own state, driven directly: each transition, and the ones that must refuse.
@Suite struct StreamChannelStateMachineTests {
    @Test func aChannelGoesLiveOnceAndEndsOnce() {
        var machine = StreamChannelStateMachine()
        #expect(!machine.isActive && !machine.mayDeliver)
        let activated = machine.activate()
        let again = machine.activate()
        #expect(activated && !again && machine.isActive)
        let first = machine.tearDown()
        let second = machine.tearDown()
        #expect(first == true && second == nil)
        let afterTearDown = machine.activate()
        #expect(!afterTearDown && machine.isTornDown && !machine.acceptsOutput)
    }

    @Test func aChannelEndedBeforeItWentLiveTellsNoPipeline() {
        var machine = StreamChannelStateMachine()
        let wasActive = machine.tearDown()
        #expect(wasActive == false)
        let activated = machine.activate()
        #expect(!activated)
    }

    @Test func finIsRequestedOnceAndEndsOutput() {
        var machine = StreamChannelStateMachine()
        let requested = machine.requestFIN()
        let twice = machine.requestFIN()
        #expect(requested && !twice && machine.isFINQueued && !machine.acceptsOutput)
        let tearDownAfterFIN = machine.finSent()
        #expect(!tearDownAfterFIN && machine.outputEnd == .finSent && !machine.isFINQueued)
        let again = machine.finSent()
        #expect(!again)
        let gracefulAfterFIN = machine.requestGracefulClose()
        #expect(!gracefulAfterFIN)
    }

    @Test func aGracefulCloseEndsTheChannelWhenItsFINIsOut() {
        var machine = StreamChannelStateMachine()
        let fin = machine.requestFIN()
        let graceful = machine.requestGracefulClose()
        let secondGraceful = machine.requestGracefulClose()
        #expect(fin && graceful && !secondGraceful && machine.isClosingGracefully)
        let tearDown = machine.finSent()
        #expect(tearDown)
    }

    @Test func thePeersEndWaitsForARead() {
        var machine = StreamChannelStateMachine()
        _ = machine.activate()
        machine.receiveEnd()
        #expect(machine.hasPendingInputEnd && !machine.mayDeliver)
        let read = machine.requestRead()
        let secondRead = machine.requestRead()
        #expect(read && !secondRead && machine.mayDeliver)
        machine.beginDelivery(hasBytes: false)
        #expect(!machine.mayDeliver && machine.readPending)
        let end = machine.takeInputEnd()
        let endAgain = machine.takeInputEnd()
        machine.endDelivery()
        #expect(end && !endAgain && machine.inputEnd == .delivered)
        machine.receiveEnd()
        #expect(machine.inputEnd == .delivered)
    }

    @Test func bytesAnswerThePendingRead() {
        var machine = StreamChannelStateMachine()
        _ = machine.activate()
        _ = machine.requestRead()
        machine.beginDelivery(hasBytes: true)
        // A read asked for during a delivery waits for the next one.
        let readDuringDelivery = machine.requestRead()
        #expect(readDuringDelivery && !machine.mayDeliver)
        machine.endDelivery()
        #expect(machine.mayDeliver)
        _ = machine.tearDown()
        let readAfterEnd = machine.requestRead()
        #expect(!readAfterEnd && !machine.mayDeliver)
    }

    @Test func theSessionsQueuesHoldAStreamOnce() {
        var machine = StreamChannelStateMachine()
        let write = machine.queueForWrite()
        let writeAgain = machine.queueForWrite()
        #expect(write && !writeAgain && machine.isQueuedForWrite)
        machine.dequeuedForWrite()
        let writeAfter = machine.queueForWrite()
        #expect(writeAfter)
        let delivery = machine.queueForDelivery()
        let deliveryAgain = machine.queueForDelivery()
        machine.dequeuedForDelivery()
        let deliveryAfter = machine.queueForDelivery()
        #expect(delivery && !deliveryAgain && deliveryAfter)
        let detached = machine.detach()
        let detachedAgain = machine.detach()
        #expect(detached && !detachedAgain && machine.isDetached)
    }
}
