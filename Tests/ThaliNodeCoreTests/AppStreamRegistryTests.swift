import Foundation
import Testing
@testable import ThaliNodeCore

/// The app streams' registry driven with plain values: sessions by contact, waiting opens, handlers.
@Suite struct AppStreamRegistryTests {
    final class Session {}
    typealias Registry = AppStreamRegistry<String, String, String>

    @Test func theNewestSessionWithAContactCarriesNewStreams() {
        var registry = Registry()
        let (older, newer) = (Session(), Session())
        _ = registry.sessionUp(ObjectIdentifier(older), "older", contactKey: "bob")
        _ = registry.sessionUp(ObjectIdentifier(newer), "newer", contactKey: "bob")
        #expect(registry.session(for: "bob")?.session == "newer")
        #expect(registry.session(for: "carol") == nil)
        registry.forgetSession(ObjectIdentifier(newer), contactKey: "bob")
        #expect(registry.session(for: "bob")?.session == "older")
        // The same session up again moves to the newest, once.
        _ = registry.sessionUp(ObjectIdentifier(newer), "newer", contactKey: "bob")
        _ = registry.sessionUp(ObjectIdentifier(older), "older again", contactKey: "bob")
        #expect(registry.sessions["bob"]?.map(\.session) == ["newer", "older again"])
        registry.forgetSession(ObjectIdentifier(older), contactKey: "bob")
        registry.forgetSession(ObjectIdentifier(newer), contactKey: "bob")
        registry.forgetSession(ObjectIdentifier(newer), contactKey: "bob")
        #expect(registry.sessions.isEmpty)
    }

    @Test func aSessionComingUpWakesTheOpensWaitingForItsContact() {
        var registry = Registry()
        let (first, second, third) = (UUID(), UUID(), UUID())
        registry.addWaiter(first, contactKey: "bob", wake: "wake 1")
        registry.addWaiter(second, contactKey: "carol", wake: "wake 2")
        registry.addWaiter(third, contactKey: "bob", wake: "wake 3")
        let session = Session()
        let woken = registry.sessionUp(ObjectIdentifier(session), "s", contactKey: "bob")
        #expect(woken.sorted() == ["wake 1", "wake 3"])
        registry.removeWaiter(first)
        registry.removeWaiter(third)
        let again = registry.sessionUp(ObjectIdentifier(Session()), "t", contactKey: "bob")
        #expect(again.isEmpty && registry.waiterCount == 1)
    }

    @Test func aSessionStaysAfterDeliveryOnlyWhenMarkedAndWanted() {
        var registry = Registry()
        let session = Session()
        let id = ObjectIdentifier(session)
        _ = registry.sessionUp(id, "s", contactKey: "bob")
        let relaying = registry.keepsAfterDelivery(id, contactKey: "bob", marked: true, relaying: true)
        #expect(relaying && registry.session(for: "bob") != nil)
        let unmarked = registry.keepsAfterDelivery(id, contactKey: "bob", marked: false, relaying: true)
        #expect(!unmarked && registry.session(for: "bob") == nil, "a closing session leaves the ones streams are opened on")
        _ = registry.sessionUp(id, "s", contactKey: "bob")
        let notWanted = registry.keepsAfterDelivery(id, contactKey: "bob", marked: true, relaying: false)
        #expect(!notWanted && registry.session(for: "bob") == nil)
        let first = registry.wantStreams()
        let second = registry.wantStreams()
        #expect(first && !second && registry.streamsWanted)
        _ = registry.sessionUp(id, "s", contactKey: "bob")
        let wanted = registry.keepsAfterDelivery(id, contactKey: "bob", marked: true, relaying: false)
        #expect(wanted && registry.session(for: "bob") != nil)
    }

    @Test func oneHandlerPerProtocolUntilTheyAreTaken() {
        var registry = Registry()
        let added = registry.addHandler("echo handler", for: "echo")
        let twice = registry.addHandler("another", for: "echo")
        #expect(added == nil && twice == .alreadyHandled && registry.handlers["echo"] == "echo handler")
        registry.removeHandler(for: "echo")
        let again = registry.addHandler("another", for: "echo")
        _ = registry.addHandler("chat handler", for: "chat")
        #expect(again == nil)
        #expect(registry.takeHandlers().sorted() == ["another", "chat handler"])
        #expect(registry.handlers.isEmpty)
    }
}
