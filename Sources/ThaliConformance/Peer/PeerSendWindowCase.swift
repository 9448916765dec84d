import Foundation
import NIOCore
import TCPMultiplexer
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP

extension PeerConformance.Cases {
    /// `peer/yamux/send-window-respected`: with more than 256 KiB to send on one stream and no window
    /// update from the suite, the implementation sends at most 256 KiB.
    public static let sendWindowRespected = ConformanceCase("peer/yamux/send-window-respected",
                                                            "with more than 256 KiB to send on a stream whose window the suite never raises, it sends at most 256 KiB of data there",
                                                            ["MUX-2.11"])
}

extension PeerConformance {
    /// How many texts the suite queues for the window case, and how long each is: together more than a
    /// stream's window (6 × 60,000 bytes against 262,144), each within a text's usual bound (ours 64 KiB)
    /// and within one frame, so that a version 3 sender sends them in one batch, without a round trip.
    static let windowTexts = (count: 6, bytes: 60_000)
    /// How long the stream must stay quiet before the suite judges what came.
    static let windowQuiet: TimeAmount = .milliseconds(1500)

    /// MUX-2.11, the sender's half: the suite queues more than a window of texts through the adapter,
    /// opens a stream on a yamux session it writes by hand (so it grants nothing: a session from a library
    /// would raise the window as it reads), welcomes the implementation's hello with version 3, a frame
    /// maximum that holds each text and a progress window far beyond them, and counts the data the
    /// implementation sends on the stream until it stops. More than 256 KiB FAILs; stopping at the window
    /// (within one frame maximum of it) PASSes; stopping well short of it (it had less to send in one go)
    /// is INCONCLUSIVE. Runs last: the texts stay queued.
    func gradeSendWindow(_ run: ConformanceRun, location: BeaconLocation, match: BeaconMatch) async {
        let testCase = Cases.sendWindowRespected
        let window = Int(YamuxHeader.initialWindowSize)
        let expected = "at most \(window) bytes of data on the stream, and close to that many"
        guard let adapter = configuration.adapter else {
            run.record(testCase, .notApplicable, expected: expected, actual: "no adapter to queue \(Self.windowTexts.count) texts with")
            return
        }
        let started = NIODeadline.now()
        do {
            for index in 0..<Self.windowTexts.count {
                let prefix = "thali-conformance window text \(index) "
                _ = try await adapter.send(text: prefix + String(repeating: "w", count: Self.windowTexts.bytes - prefix.utf8.count),
                                           to: configuration.nameAtPeer)
            }
        } catch {
            run.record(testCase, .inconclusive, expected: expected, actual: "could not queue the texts: \(error)", started: started)
            return
        }
        let maximum = UInt32(Self.windowTexts.bytes + 1024)
        let quiet = Self.windowQuiet
        do {
            let (sent, ending) = try await RawYamuxSession.run(keyedBy: match, at: location, group: group) { session -> (Int, String) in
                try await session.send([(YamuxHeader(type: .windowUpdate, flags: .syn, streamID: 1, length: 0), 0)])
                var sent = 0, welcomed = false
                while true {
                    let input = try await session.next(within: welcomed ? quiet : configuration.stepTimeout)
                    switch input {
                    case .frame(let header) where header.streamID == 1 && header.type == .data:
                        sent += Int(header.length)
                        if header.flags.contains(.rst) || header.flags.contains(.fin) { return (sent, "it ended the stream") }
                        if sent > window { return (sent, "past the window") }
                        if !welcomed {
                            // Its first data is its hello: welcome it (version 3), opening the delivery.
                            var welcome = ByteBuffer()
                            DeliveryFrame.welcome(version: 3, maxFramePayloadBytes: maximum, progressWindowBytes: UInt32(16 << 20))
                                .encode(into: &welcome)
                            try await session.sendData(welcome, streamID: 1)
                            welcomed = true
                        }
                    case .frame(let header) where header.streamID == 1 && header.flags.contains(.rst):
                        return (sent, "it reset the stream")
                    case .frame:
                        continue
                    case .timedOut, .deadline:
                        return (sent, welcomed ? "then nothing for \(Self.text(quiet))" : "no hello within \(Self.text(configuration.stepTimeout))")
                    case .ended(let reason), .failed(let reason):
                        return (sent, "the session ended: \(reason)")
                    }
                }
            }
            let actual = "\(sent) bytes of data on the stream, \(ending)"
            if sent > window {
                run.grade(testCase, holds: false, expected: expected, actual: actual, started: started)
            } else if sent > window - Int(maximum) - 64 {
                run.grade(testCase, holds: true, expected: expected, actual: actual, started: started)
            } else {
                run.record(testCase, .inconclusive, expected: expected,
                           actual: actual + ": it stopped short of the window, so the window never bound", started: started)
            }
        } catch {
            run.record(testCase, .inconclusive, expected: expected, actual: "no session: \(error)", started: started)
        }
    }
}
