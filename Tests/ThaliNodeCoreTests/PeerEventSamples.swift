import Foundation
import Testing
@testable import ThaliNodeCore

/// At least one ``PeerEvent`` of every case, and of every delivery event, with their optional parts
/// both present and absent. A new case of either enum fails to compile here until it has a sample:
/// ``kind(of:)`` switches over every case without a default, and ``samples(of:)`` over every kind.
enum PeerEventSamples {
    /// Every case of ``PeerEvent``, and of ``DeliveryEvent`` inside ``PeerEvent/delivery(contact:_:)``.
    enum Kind: CaseIterable {
        case started, locationChanged, advertising, peerAppeared, peerLeft, beaconMatched, connecting, connected, connectionFailed
        case disconnected, sessionEnded, limitTriggered, relayListening, relayReopened, relayClosed, relayPortUnavailable
        case relayAppUnreachable, streamRefused, bindingUnavailable, stopped
        case offered, transferStarted, progress, delivered, refused, deferred, refusedOffer, rejected, discarded
        case received, duplicate
    }

    static func kind(of event: PeerEvent) -> Kind {
        switch event {
        case .started: .started
        case .locationChanged: .locationChanged
        case .advertising: .advertising
        case .peerAppeared: .peerAppeared
        case .peerLeft: .peerLeft
        case .beaconMatched: .beaconMatched
        case .connecting: .connecting
        case .connected: .connected
        case .connectionFailed: .connectionFailed
        case .disconnected: .disconnected
        case .sessionEnded: .sessionEnded
        case .limitTriggered: .limitTriggered
        case .relayListening: .relayListening
        case .relayReopened: .relayReopened
        case .relayClosed: .relayClosed
        case .relayPortUnavailable: .relayPortUnavailable
        case .relayAppUnreachable: .relayAppUnreachable
        case .streamRefused: .streamRefused
        case .bindingUnavailable: .bindingUnavailable
        case .stopped: .stopped
        case .delivery(_, let delivery):
            switch delivery {
            case .offered: .offered
            case .transferStarted: .transferStarted
            case .progress: .progress
            case .delivered: .delivered
            case .refused: .refused
            case .deferred: .deferred
            case .refusedOffer: .refusedOffer
            case .rejected: .rejected
            case .discarded: .discarded
            case .received: .received
            case .duplicate: .duplicate
            }
        }
    }

    static let wifi = PeerLocation("http://10.0.0.2:4000/NotificationBeacons")!
    static let bluetooth = PeerLocation("bluetooth:00:AA:01:00:00:01")!
    static let lora = PeerLocation("lora:node-7")!
    static let id = UUID(uuidString: "7A1B2C3D-0000-4000-8000-000000000001")!
    static let refusedConnection = PeerConnectionError(.refused, address: "10.0.0.2:4000")
    static let reset = PeerConnectionError(.reset, address: "10.0.0.2:4000")
    static let text = ItemOffer(id: id, kind: .text, size: 19, sha256: Array(repeating: 1, count: 32), createdMilliseconds: 1,
                                expiresMilliseconds: 2, name: "")
    static let file = ItemOffer(id: id, kind: .file, size: 52_428_800, sha256: Array(repeating: 2, count: 32),
                                createdMilliseconds: 1, expiresMilliseconds: 2, name: "big \"iso\".iso")

    /// The samples of `kind`; each is of that kind.
    static func samples(of kind: Kind) -> [PeerEvent] {
        switch kind {
        case .started: [.started(location: wifi), .started(location: bluetooth)]
        case .locationChanged: [.locationChanged(location: PeerLocation("http://10.0.0.9:4000/NotificationBeacons")!, previous: wifi)]
        case .advertising: [.advertising(contacts: []), .advertising(contacts: ["bob", "carol"])]
        case .peerAppeared: [.peerAppeared(location: wifi), .peerAppeared(location: lora)]
        case .peerLeft: [.peerLeft(location: wifi, reason: .byebye), .peerLeft(location: bluetooth, reason: .narrowed)]
        case .beaconMatched: [.beaconMatched(contact: .sample("bob"), location: bluetooth)]
        case .connecting: [.connecting(contact: .sample("bob"), location: wifi, attempt: 3)]
        case .connected: [.connected(contact: .sample("bob"), role: .connecting, binding: .wifi, remote: "10.0.0.2:4000"),
                          .connected(contact: .sample("bob"), role: .accepting, binding: .bluetooth, remote: nil)]
        case .connectionFailed: [.connectionFailed(contact: .sample("bob"), reason: refusedConnection, retryIn: .milliseconds(1500)),
                                 .connectionFailed(contact: .sample("bob"), reason: reset, retryIn: nil)]
        case .disconnected: [.disconnected(contact: .sample("bob"), role: .accepting, binding: .wifi, remote: "10.0.0.2:4000", reason: nil),
                             .disconnected(contact: .sample("bob"), role: .connecting, binding: .bluetooth, remote: nil, reason: reset)]
        case .sessionEnded: [.sessionEnded(contact: .sample("bob"), role: .accepting, error: nil),
                             .sessionEnded(contact: .sample("bob"), role: .connecting, error: PeerConnectionError(CancellationError(), address: "10.0.0.2:4000"))]
        case .limitTriggered: [.limitTriggered(PeerLimitReport(kind: .httpOverload, effect: .portClosed, period: .milliseconds(30_250),
                                                               detail: "1001 connections within 5 s"))]
        case .relayListening: [.relayListening(contact: .sample("bob"), port: 7000)]
        case .relayReopened: [.relayReopened(contact: .sample("bob"), port: 7000)]
        case .relayClosed: [.relayClosed(contact: .sample("bob"), port: 7000)]
        case .relayPortUnavailable: [.relayPortUnavailable(contact: .sample("bob"), port: 7000, reason: "address in use", instead: 7001),
                                     .relayPortUnavailable(contact: .sample("bob"), port: 7000, reason: "address in use", instead: nil)]
        case .relayAppUnreachable: [.relayAppUnreachable(contact: .sample("bob"), role: .accepting,
                                                         error: PeerConnectionError(.refused, address: "127.0.0.1:8080")),
                                    .relayAppUnreachable(contact: .sample("bob"), role: .connecting, error: nil)]
        case .streamRefused: [.streamRefused(contact: .sample("bob"), role: .accepting, kind: "app/chat",
                                             refusal: StreamRefusal(.notServed, reason: "no handler: for app/chat"), byThisNode: true),
                              .streamRefused(contact: .sample("bob"), role: .connecting, kind: nil,
                                             refusal: StreamRefusal(.init(rawValue: 9), reason: "late"), byThisNode: false)]
        case .bindingUnavailable: [.bindingUnavailable(binding: .bluetooth, reason: "no adapter hci0")]
        case .stopped: [.stopped]
        case .offered: [.delivery(contact: .sample("bob"), .offered(text)), .delivery(contact: .sample("bob"), .offered(file))]
        case .transferStarted: [.delivery(contact: .sample("bob"), .transferStarted(id: id, offset: 4096, total: 52_428_800))]
        case .progress: [.delivery(contact: .sample("bob"), .progress(id: id, bytes: 10, total: 20))]
        case .delivered: [.delivery(contact: .sample("bob"), .delivered(id: id, alreadyStored: false)),
                          .delivery(contact: .sample("bob"), .delivered(id: id, alreadyStored: true))]
        case .refused: [.delivery(contact: .sample("bob"), .refused(file, .tooLarge)), .delivery(contact: .sample("bob"), .refused(text, .expired))]
        case .deferred: [.delivery(contact: .sample("bob"), .deferred(file, .noSpace, retryIn: .seconds(300)))]
        case .refusedOffer: [.delivery(contact: .sample("alice"), .refusedOffer(file, .noSpace, reason: "not enough space: 1.0 MiB free"))]
        case .rejected: [.delivery(contact: .sample("bob"), .rejected(id: id, .digestMismatch))]
        case .discarded: [.delivery(contact: .sample("alice"), .discarded(id: id, .invalidText))]
        case .received: [
            .delivery(contact: .sample("alice"), .received(InboxItem(itemID: id, fromContact: "alice", fromPublicKey: "02ab", kind: .text,
                                                            text: "hello\u{85} bob \u{202E}", filePath: nil, fileName: nil, size: 12,
                                                            sha256: Data(repeating: 3, count: 32), createdAtMs: 1, receivedAtMs: 2))),
            .delivery(contact: .sample("alice"), .received(InboxItem(itemID: id, fromContact: "alice", fromPublicKey: "02ab", kind: .file,
                                                            text: nil, filePath: "/tmp/inbox/x", fileName: "photo.jpg", size: 300_000,
                                                            sha256: Data(repeating: 3, count: 32), createdAtMs: 1, receivedAtMs: 2))),
        ]
        case .duplicate: [.delivery(contact: .sample("alice"), .duplicate(id: id))]
        }
    }

    /// Every sample, in the order of ``Kind/allCases``.
    static var all: [PeerEvent] { Kind.allCases.flatMap(samples(of:)) }
}

/// The sample table itself: every kind has samples, and each sample is of the kind it is listed under, so
/// that the round-trip tests over ``PeerEventSamples/all`` cover every case.
@Suite struct PeerEventSamplesTests {
    @Test("every kind has a sample, each of its own kind, and no two samples are alike")
    func everyKindIsSampled() {
        for kind in PeerEventSamples.Kind.allCases {
            let samples = PeerEventSamples.samples(of: kind)
            #expect(!samples.isEmpty, "\(kind) has no sample")
            for sample in samples { #expect(PeerEventSamples.kind(of: sample) == kind, "\(sample) is listed under \(kind)") }
        }
        let all = PeerEventSamples.all
        #expect(Set(all.map(PeerEventSamples.kind(of:))).count == PeerEventSamples.Kind.allCases.count)
        #expect(Set(all).count == all.count, "a repeated sample tests nothing more")
    }
}
