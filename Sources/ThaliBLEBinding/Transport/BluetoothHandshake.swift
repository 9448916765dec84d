/// The one-octet exchange that opens every Thali Bluetooth connection (seed, "The Bluetooth handshake
/// and surprise connections"): the client sends 0 (it has notification beacons) or 1 (it has none); the
/// server answers 0. Any other octet ends the connection. Also shakes out half-open Bluetooth links.
public enum BluetoothHandshake {
    /// The client's first octet.
    public enum ClientHello: UInt8, Sendable, Hashable {
        /// The client is advertising notification beacons (for anyone); the server should fetch them.
        case hasNotifications = 0
        /// The client has nothing to advertise.
        case hasNoNotifications = 1
    }

    /// The server's only valid answer.
    public static let serverAcknowledgement: UInt8 = 0

    /// What broke the handshake.
    public enum Violation: Error, Hashable, Sendable, CustomStringConvertible {
        /// The server received a first octet other than 0 or 1.
        case invalidClientHello(UInt8)
        /// The client received a first octet other than 0.
        case invalidServerAcknowledgement(UInt8)
        /// The stream ended (closed, reset or failed) before the handshake octet arrived.
        case closedBeforeHandshake
        /// The handshake octet did not arrive within `BluetoothBindingLimits.handshakeTimeout`.
        case timedOut

        public var description: String {
            switch self {
            case .invalidClientHello(let byte): return "Bluetooth handshake: client sent \(byte), expected 0 or 1"
            case .invalidServerAcknowledgement(let byte): return "Bluetooth handshake: server answered \(byte), expected 0"
            case .closedBeforeHandshake: return "Bluetooth handshake: the connection ended before the handshake octet"
            case .timedOut: return "Bluetooth handshake: timed out"
            }
        }
    }

    /// How a completed handshake ended, reported to the side that ran it.
    public enum Outcome: Hashable, Sendable {
        /// Server side: the client's hello. `.hasNotifications` from a device never seen over BLE is a
        /// "surprise connection" and counts as a BLE discovery of that device.
        case serverReceived(ClientHello)
        /// Client side: the server acknowledged.
        case clientAcknowledged
    }

    /// The server's state machine.
    public enum ServerState: Hashable, Sendable {
        /// Waiting for the client's first octet.
        case awaitingHello
        /// Acknowledged; the stream is relayed from now on.
        case completed(ClientHello)
        /// Ended by a violation; the stream is closed.
        case failed(Violation)

        /// What the server must do after an event.
        public enum Action: Hashable, Sendable {
            /// Send `serverAcknowledgement`, then relay; the hello is reported.
            case acknowledge(ClientHello)
            /// End the connection.
            case close(Violation)
            /// Nothing (already decided).
            case none
        }

        /// Feeds the first octet received.
        public mutating func receive(_ octet: UInt8) -> Action {
            guard case .awaitingHello = self else { return .none }
            guard let hello = ClientHello(rawValue: octet) else {
                self = .failed(.invalidClientHello(octet))
                return .close(.invalidClientHello(octet))
            }
            self = .completed(hello)
            return .acknowledge(hello)
        }

        /// The stream ended or the timer fired.
        public mutating func fail(_ violation: Violation) -> Action {
            guard case .awaitingHello = self else { return .none }
            self = .failed(violation)
            return .close(violation)
        }
    }

    /// The client's state machine.
    public enum ClientState: Hashable, Sendable {
        /// Connected, nothing sent yet.
        case idle
        /// Hello sent, waiting for the server's octet.
        case awaitingAcknowledgement(ClientHello)
        /// Acknowledged; the stream is relayed from now on.
        case completed
        /// Ended by a violation; the stream is closed.
        case failed(Violation)

        /// What the client must do after an event.
        public enum Action: Hashable, Sendable {
            /// Send this hello octet.
            case send(ClientHello)
            /// The server acknowledged; relay from now on.
            case completed
            /// End the connection.
            case close(Violation)
            /// Nothing.
            case none
        }

        /// The connection is up: send the hello.
        public mutating func start(_ hello: ClientHello) -> Action {
            guard case .idle = self else { return .none }
            self = .awaitingAcknowledgement(hello)
            return .send(hello)
        }

        /// Feeds the first octet received from the server.
        public mutating func receive(_ octet: UInt8) -> Action {
            guard case .awaitingAcknowledgement = self else {
                if case .idle = self {
                    // The server spoke before we did: it is not following the protocol.
                    self = .failed(.invalidServerAcknowledgement(octet))
                    return .close(.invalidServerAcknowledgement(octet))
                }
                return .none
            }
            guard octet == BluetoothHandshake.serverAcknowledgement else {
                self = .failed(.invalidServerAcknowledgement(octet))
                return .close(.invalidServerAcknowledgement(octet))
            }
            self = .completed
            return .completed
        }

        /// The stream ended or the timer fired.
        public mutating func fail(_ violation: Violation) -> Action {
            switch self {
            case .idle, .awaitingAcknowledgement:
                self = .failed(violation)
                return .close(violation)
            case .completed, .failed:
                return .none
            }
        }
    }
}
