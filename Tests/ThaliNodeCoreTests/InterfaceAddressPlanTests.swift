import Testing
@testable import ThaliNodeCore

/// What a peer that follows its interface does when the interface's IPv4 addresses change.
@Suite struct InterfaceAddressPlanTests {
    @Test func staysWhileTheBoundAddressIsKept() {
        var plan = InterfaceAddressPlan(bound: "10.0.0.2", addresses: ["10.0.0.2"])
        // A second address beside it is no move.
        #expect(plan.addressesChanged(to: ["10.0.0.2", "10.0.9.2"]) == .stay)
        #expect(plan.addressesChanged(to: ["10.0.9.2", "10.0.0.2"]) == .stay)
        #expect(plan.bound == "10.0.0.2")
    }

    @Test func movesToTheNewAddressWhenTheBoundOneIsReplaced() {
        var plan = InterfaceAddressPlan(bound: "10.0.0.2", addresses: ["10.0.0.2"])
        #expect(plan.addressesChanged(to: ["10.0.1.7"]) == .move(from: "10.0.0.2", to: "10.0.1.7"))
        #expect(plan.bound == "10.0.1.7")
        #expect(plan.addressesChanged(to: ["10.0.1.7"]) == .stay)
        // And back again.
        #expect(plan.addressesChanged(to: ["10.0.0.2"]) == .move(from: "10.0.1.7", to: "10.0.0.2"))
    }

    @Test func movesToTheFirstListedWhenSeveralRemain() {
        var plan = InterfaceAddressPlan(bound: "10.0.0.2", addresses: ["10.0.0.2", "10.0.5.5", "10.0.6.6"])
        #expect(plan.addressesChanged(to: ["10.0.5.5", "10.0.6.6"]) == .move(from: "10.0.0.2", to: "10.0.5.5"))
    }

    @Test func waitsOnceWithoutAnAddressThenMovesOrStays() {
        var plan = InterfaceAddressPlan(bound: "10.0.0.2", addresses: ["10.0.0.2"])
        #expect(plan.addressesChanged(to: []) == .waitForAddress(lost: "10.0.0.2"))
        #expect(plan.addressesChanged(to: []) == .stay)
        #expect(plan.bound == "10.0.0.2")
        // The same address back: nothing moved.
        #expect(plan.addressesChanged(to: ["10.0.0.2"]) == .stay)
        #expect(plan.addressesChanged(to: []) == .waitForAddress(lost: "10.0.0.2"))
        #expect(plan.addressesChanged(to: ["10.0.3.3"]) == .move(from: "10.0.0.2", to: "10.0.3.3"))
    }

    @Test func anInterfaceWithoutAddressAtStartWaitsWithoutAReport() {
        var plan = InterfaceAddressPlan(bound: "10.0.0.2", addresses: [])
        #expect(plan.addressesChanged(to: []) == .stay)
        #expect(plan.addressesChanged(to: ["10.0.4.4"]) == .move(from: "10.0.0.2", to: "10.0.4.4"))
    }
}
