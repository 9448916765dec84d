import Crypto
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliNodeCore
import ThaliPSKTLS
import ThaliSSDP

extension PeerConformance {
    // MARK: Negative cases

    func negativeCases(_ run: ConformanceRun, location: BeaconLocation, match: BeaconMatch?) async {
        let timeout = configuration.stepTimeout
        var started = NIODeadline.now()
        let first = await TLSHelloProbe.send(.thaliSuite, host: location.host, port: location.port, timeout: timeout, group: group)
        if case .serverHello(let flight) = first, let exchange = flight.keyExchange, flight.cipherSuite == PSKTLSProfile.cipherSuiteID {
            run.grade(Cases.dhSize, holds: exchange.primeBits >= PSKTLSProfile.minimumDHBits, expected: "a prime of at least 2048 bits",
                      actual: "\(exchange.primeBits) bits", started: started)
            run.grade(Cases.noHint, holds: exchange.identityHint.isEmpty, expected: "an empty psk_identity_hint",
                      actual: exchange.identityHint.isEmpty ? "empty" : "\(exchange.identityHint.count) bytes")
            run.grade(Cases.noCompression, holds: flight.compressionMethod == 0, expected: "compression method 0 (none)",
                      actual: "compression method \(flight.compressionMethod)")
            let ticket = flight.extensions.contains(0x0023)
            run.grade(Cases.noTickets, holds: !ticket, expected: "no session_ticket extension in the ServerHello",
                      actual: ticket ? "session_ticket extension sent" : "none")
            started = NIODeadline.now()
            let second = await TLSHelloProbe.send(.thaliSuite, host: location.host, port: location.port, timeout: timeout, group: group)
            if case .serverHello(let again) = second, let other = again.keyExchange {
                run.grade(Cases.dhFresh, holds: other.serverPublic != exchange.serverPublic, expected: "a different dh_Ys",
                          actual: other.serverPublic == exchange.serverPublic ? "the same dh_Ys twice" : "different", started: started)
            } else {
                run.record(Cases.dhFresh, .inconclusive, expected: "a second ServerKeyExchange", actual: second.description, started: started)
            }
        } else {
            for testCase in [Cases.dhSize, Cases.noHint, Cases.noCompression, Cases.noTickets, Cases.dhFresh] {
                run.record(testCase, .fail, expected: "ServerHello with 0x00AB and a DHE-PSK ServerKeyExchange",
                           actual: first.description, started: started)
            }
        }

        let randomIdentity = Data((0..<144).map { _ in UInt8.random(in: .min ... .max) }).base64EncodedString()
        await refusedHandshake(run, Cases.unknownIdentity, location: location, identity: randomIdentity,
                               expected: .unknownPSKIdentity, what: "a random identity")
        if let match {
            await refusedHandshake(run, Cases.wrongPSK, location: location, identity: match.pskIdentity,
                                   expected: .badRecordMAC, what: "its identity and a wrong PSK")
            started = NIODeadline.now()
            let answer = await RenegotiationProbe.run(host: location.host, port: location.port, identity: match.pskIdentity,
                                                      psk: match.psk, timeout: configuration.renegotiationTimeout, group: group)
            run.record(Cases.renegotiationRefused, answer.verdict, expected: "a no_renegotiation alert, no second handshake",
                       actual: answer.description, started: started)
        } else {
            for testCase in [Cases.wrongPSK, Cases.renegotiationRefused] {
                run.record(testCase, .inconclusive, expected: testCase.title, actual: "no identity of its own matched")
            }
        }

        let refusals: [(ConformanceCase, TLSHelloProbe.Hello, UInt8)] = [(Cases.tls13, .tls13Only, 70),
                                                                         (Cases.otherSuites, .otherSuitesOnly, 40)]
        for (testCase, hello, alert) in refusals {
            started = NIODeadline.now()
            let outcome = await TLSHelloProbe.send(hello, host: location.host, port: location.port, timeout: timeout, group: group)
            let verdict: ConformanceVerdict
            switch outcome {
            case .alert(_, let code): verdict = code == alert ? .pass : .warn
            case .serverHello: verdict = .fail
            case .closed, .malformed: verdict = .warn
            case .timedOut, .connectFailed: verdict = .inconclusive
            }
            run.record(testCase, verdict, expected: "a fatal \(alertName(alert)) alert", actual: outcome.description, started: started)
        }
    }

    /// Connects with `identity` and a random PSK: PASS when the handshake fails with `expected`, WARN
    /// when it fails otherwise (the MUST is the failure, the alert a SHOULD), FAIL when it succeeds.
    func refusedHandshake(_ run: ConformanceRun, _ testCase: ConformanceCase, location: BeaconLocation,
                                  identity: String, expected alert: TLSAlert, what: String) async {
        let started = NIODeadline.now()
        let expected = "a fatal \(alert) alert"
        do {
            let connection = try await PSKTLSClient.connect(host: location.host, port: location.port, identity: identity,
                                                            psk: (0..<16).map { _ in UInt8.random(in: .min ... .max) },
                                                            eventLoopGroup: group)
            try? await connection.executeThenClose { _, _ in }
            run.record(testCase, .fail, expected: expected, actual: "the handshake succeeded with \(what)", started: started)
        } catch let error as PSKTLSError {
            let verdict: ConformanceVerdict = error.reason == .alertReceived(alert) ? .pass : .warn
            run.record(testCase, verdict, expected: expected, actual: error.description, started: started)
        } catch {
            run.record(testCase, .warn, expected: expected, actual: "\(error)", started: started)
        }
    }
}
