import Foundation
import Logging
import NIOCore
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP

/// The node's configuration, read from `config.json` in the data directory. Every key is optional and
/// has a default; unknown keys are errors (a typo must not silently fall back to a default). The keys and
/// their meaning are documented on the properties below and in `spec/node.md`.
public struct NodeConfiguration: Sendable, Hashable {
    /// `interface`: the network interface to announce on and listen on (e.g. `"eth0"`, `"lo"`); `null`
    /// picks the first interface that is up and has an IPv4 address. Default `null`.
    public var interface: String?
    /// `deliveryPort`: the peer's one TCP port, serving `/NotificationBeacons` and PSK-TLS; 0 picks a free
    /// port. Default 0.
    public var deliveryPort: Int
    /// `beaconPort`: the same port by its other name, used when `deliveryPort` is 0 (`run` refuses two
    /// different ports). Default 0.
    public var beaconPort: Int
    /// `ssdpMulticastAddress`: IPv4 multicast group for SSDP. Default `"239.255.255.250"`.
    public var ssdpMulticastAddress: String
    /// `ssdpPort`: UDP port for SSDP. Default 1900.
    public var ssdpPort: Int
    /// `beaconProfile`: beacon wire profile, `"spec"` or `"cordova"`. Default `"spec"`.
    public var beaconProfile: BeaconProfile
    /// `beaconValiditySeconds`: how long an announcement's beacons stay valid, 1 … 86399 (the beacon
    /// generator's maximum of 24 h − 255 ms, in whole seconds). Default 3600.
    public var beaconValiditySeconds: Int

    /// ``beaconValiditySeconds`` as the duration ThaliBeacons' generator takes.
    public var beaconValidity: Duration { .seconds(beaconValiditySeconds) }
    /// `defaultItemExpirySeconds`: expiry of a queued item when `send` gets no `--expires-in`; at least 1.
    /// Default 604800 (7 days).
    public var defaultItemExpirySeconds: Int
    /// `logLevel`: `trace`, `debug`, `info`, `notice`, `warning`, `error` or `critical`. Default `info`.
    public var logLevel: Logger.Level
    /// `dhGroup`: the RFC 7919 group the peer's PSK-TLS server uses, `ffdhe2048`, `ffdhe3072` or
    /// `ffdhe4096`. Default `ffdhe2048`: the spec's minimum, chosen because every incoming connection costs
    /// the server a DH key generation before it can tell a contact from a stranger (measured here: about
    /// 6 ms per handshake at 2048 bits, 17 ms at 3072), and the PSK, not the group, authenticates.
    public var dhGroup: DHGroup
    /// `maxFramePayloadBytes`, `chunkBytes`, `maxNameBytes`, `maxItemBytes`, `maxTextBytes`, `blockBytes`,
    /// `writebackBytes`, `readAheadBlocks`, `inboundFrames`, `directWrites`, `progressWindowBytes`, `writeIntervalMs`, `maxBatchItems`, `batchesInFlight`, `idleTimeoutSeconds`, `lingerSeconds`, `partialRetentionSeconds`, `minimumFreeBytes`, `noSpaceRetrySeconds`, `noSpaceRetryMaxSeconds`: the delivery limits (see ``DeliveryLimits`` for their defaults and meaning).
    public var limits: DeliveryLimits
    /// `wifi`: whether `run` uses the Wi-Fi binding (SSDP on `interface`). Default `true`; `false` needs
    /// `bluetooth` (`run --no-wifi`).
    public var wifi: Bool
    /// `bluetooth`: whether `run` also uses Bluetooth (BLE discovery through bluetoothd, RFCOMM). Default
    /// `false` (`run --bluetooth`).
    public var bluetooth: Bool
    /// `bluetoothAdapter`: the adapter `run` uses for Bluetooth (e.g. `"hci0"`); `null` picks the first
    /// powered one. Default `null` (`run --adapter`).
    public var bluetoothAdapter: String?
    /// `bluetoothMakeConnectable`: whether `run` makes the adapter discoverable when bluetoothd left its
    /// page scan off, so that peers can connect (ThaliNodeBluetooth's `BluetoothPeerConfiguration.makeConnectable`). Default
    /// `true`; `false` only warns.
    public var bluetoothMakeConnectable: Bool

    /// The defaults.
    public init() {
        interface = nil
        deliveryPort = 0
        beaconPort = 0
        ssdpMulticastAddress = SSDPDiscoveryConfiguration.defaultGroupAddress
        ssdpPort = SSDPDiscoveryConfiguration.defaultPort
        beaconProfile = .spec
        beaconValiditySeconds = 3600
        defaultItemExpirySeconds = 7 * 24 * 3600
        logLevel = .info
        dhGroup = .ffdhe2048
        limits = .default
        wifi = true
        bluetooth = false
        bluetoothAdapter = nil
        bluetoothMakeConnectable = true
    }

    /// Every key the file may contain.
    public static let keys: [String] = [
        "interface", "deliveryPort", "beaconPort", "ssdpMulticastAddress", "ssdpPort", "beaconProfile",
        "beaconValiditySeconds", "defaultItemExpirySeconds", "logLevel", "dhGroup", "maxFramePayloadBytes", "chunkBytes",
        "maxNameBytes", "maxItemBytes", "maxTextBytes", "blockBytes", "writebackBytes", "readAheadBlocks", "inboundFrames", "directWrites", "progressWindowBytes",
        "writeIntervalMs", "maxBatchItems", "batchesInFlight",
        "idleTimeoutSeconds", "lingerSeconds", "partialRetentionSeconds", "minimumFreeBytes", "noSpaceRetrySeconds", "noSpaceRetryMaxSeconds",
        "wifi", "bluetooth", "bluetoothAdapter", "bluetoothMakeConnectable",
    ]

    /// Loads the configuration of `home`: the defaults when `config.json` does not exist, else the file.
    public static func load(home: NodeHome) throws -> NodeConfiguration {
        let path = home.configurationPath
        guard FileManager.default.fileExists(atPath: path) else { return NodeConfiguration() }
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            throw ConfigurationError(path: path, key: nil, problem: .unreadable(error.localizedDescription))
        }
        return try parse(data, path: path)
    }

    /// Parses the JSON text of a configuration file (`path` is for error messages).
    public static func parse(_ data: Data, path: String) throws -> NodeConfiguration {
        let dictionary: [String: JSONValue]
        do {
            dictionary = try JSONDecoder().decode([String: JSONValue].self, from: data)
        } catch let error as DecodingError {
            throw ConfigurationError(path: path, key: nil, problem: .notJSON(syntaxErrorLocation(in: data) ?? error.summary))
        } catch {
            throw ConfigurationError(path: path, key: nil, problem: .notJSON("\(error)"))
        }
        let fields = ConfigurationFields(dictionary: dictionary, path: path)
        if let unknown = dictionary.keys.sorted().first(where: { !keys.contains($0) }) {
            throw ConfigurationError(path: path, key: unknown, problem: .unknownKey)
        }
        var configuration = NodeConfiguration()
        configuration.interface = try fields.optionalString("interface")
        configuration.deliveryPort = try fields.integer("deliveryPort", default: 0, range: 0...65535)
        configuration.beaconPort = try fields.integer("beaconPort", default: 0, range: 0...65535)
        configuration.ssdpMulticastAddress = try fields.string("ssdpMulticastAddress", default: configuration.ssdpMulticastAddress) {
            (try? SocketAddress(ipAddress: $0, port: 0)) != nil ? nil : "not an IP address"
        }
        configuration.ssdpPort = try fields.integer("ssdpPort", default: configuration.ssdpPort, range: 1...65535)
        let profile = try fields.string("beaconProfile", default: BeaconProfile.spec.rawValue) {
            BeaconProfile(rawValue: $0) == nil ? "must be \"spec\" or \"cordova\"" : nil
        }
        configuration.beaconProfile = BeaconProfile(rawValue: profile) ?? .spec
        configuration.beaconValiditySeconds = try fields.integer(
            "beaconValiditySeconds", default: 3600, range: 1...Int(BeaconWire.maximumValidityMilliseconds / 1000))
        configuration.defaultItemExpirySeconds = try fields.integer("defaultItemExpirySeconds", default: 7 * 24 * 3600,
                                                                    range: 1...Int(Int32.max))
        let level = try fields.string("logLevel", default: "info") {
            Logger.Level(rawValue: $0) == nil ? "must be one of trace, debug, info, notice, warning, error, critical" : nil
        }
        configuration.logLevel = Logger.Level(rawValue: level) ?? .info
        let group = try fields.string("dhGroup", default: DHGroup.ffdhe2048.rawValue) {
            DHGroup(rawValue: $0) == nil ? "must be one of \(DHGroup.allCases.map(\.rawValue).joined(separator: ", "))" : nil
        }
        configuration.dhGroup = DHGroup(rawValue: group) ?? .ffdhe2048
        let defaults = DeliveryLimits.default
        let frame = try fields.integer("maxFramePayloadBytes", default: defaults.maxFramePayloadBytes,
                                       range: DeliveryLimits.minimumFramePayloadBytes...(16 << 20))
        let chunk = try fields.integer("chunkBytes", default: min(defaults.chunkBytes, frame), range: 1...frame)
        let name = try fields.integer("maxNameBytes", default: defaults.maxNameBytes, range: 1...Int(UInt16.max))
        let item = try fields.integer("maxItemBytes", default: Int(defaults.maxItemBytes), range: 0...Int.max)
        let text = try fields.integer("maxTextBytes", default: Int(defaults.maxTextBytes), range: 0...Int.max)
        let block = try fields.integer("blockBytes", default: defaults.blockBytes, range: 4096...(256 << 20))
        let writeback = try fields.integer("writebackBytes", default: defaults.writebackBytes, range: (64 << 10)...(1 << 30))
        let readAhead = try fields.integer("readAheadBlocks", default: defaults.readAheadBlocks, range: 1...64)
        let inbound = try fields.integer("inboundFrames", default: defaults.inboundFrames, range: 2...4096)
        let direct = try fields.bool("directWrites", default: defaults.directWrites)
        // Never below what the receiver holds unreported (two blocks and a frame, twice), never past the wire's field.
        let windowFloor = DeliveryLimits(maxFramePayloadBytes: frame, maxNameBytes: name, blockBytes: block).minimumProgressWindowBytes
        let window = try fields.integer("progressWindowBytes", default: max(defaults.progressWindowBytes, windowFloor),
                                        range: windowFloor...Int(UInt32.max))
        let writeInterval = try fields.integer("writeIntervalMs", default: Int(defaults.writeInterval.wholeMilliseconds),
                                               range: 1...10_000)
        let batch = try fields.integer("maxBatchItems", default: defaults.maxBatchItems, range: 1...4096)
        let batchesInFlight = try fields.integer("batchesInFlight", default: defaults.batchesInFlight, range: 1...64)
        let idle = try fields.integer("idleTimeoutSeconds", default: 60, range: 1...86400)
        let linger = try fields.integer("lingerSeconds", default: Int(defaults.lingerInterval.components.seconds), range: 0...86400)
        let retention = try fields.integer("partialRetentionSeconds", default: 7 * 24 * 3600, range: 60...Int(Int32.max))
        let reserve = try fields.integer("minimumFreeBytes", default: Int(defaults.minimumFreeBytes), range: 0...Int.max)
        let retryBase = try fields.integer("noSpaceRetrySeconds", default: Int(defaults.noSpaceRetryBase.components.seconds),
                                           range: 1...86400)
        let retryCap = try fields.integer("noSpaceRetryMaxSeconds", default: max(Int(defaults.noSpaceRetryCap.components.seconds), retryBase),
                                          range: retryBase...(7 * 86400))
        configuration.limits = DeliveryLimits(maxFramePayloadBytes: frame, chunkBytes: chunk, maxNameBytes: name,
                                              maxItemBytes: UInt64(item), maxTextBytes: UInt64(text),
                                              blockBytes: block, writebackBytes: writeback, readAheadBlocks: readAhead, inboundFrames: inbound,
                                              directWrites: direct,
                                              progressWindowBytes: window,
                                              writeInterval: .milliseconds(Int64(writeInterval)),
                                              maxBatchItems: batch, batchesInFlight: batchesInFlight, idleTimeout: .seconds(Int64(idle)),
                                              lingerInterval: .seconds(Int64(linger)),
                                              partialRetention: .seconds(Int64(retention)),
                                              minimumFreeBytes: UInt64(reserve),
                                              noSpaceRetryBase: .seconds(Int64(retryBase)), noSpaceRetryCap: .seconds(Int64(retryCap)))
        configuration.wifi = try fields.bool("wifi", default: true)
        configuration.bluetooth = try fields.bool("bluetooth", default: false)
        configuration.bluetoothAdapter = try fields.optionalString("bluetoothAdapter")
        configuration.bluetoothMakeConnectable = try fields.bool("bluetoothMakeConnectable", default: true)
        if !configuration.wifi && !configuration.bluetooth {
            throw ConfigurationError(path: path, key: "wifi", problem: .invalidValue("false needs \"bluetooth\": true (a node needs a binding)"))
        }
        return configuration
    }

    /// Where the JSON text `data` first goes wrong, as "line L, column C: what", or nil when the
    /// syntax is fine (the problem is then the shape, which the decoder's message describes).
    static func syntaxErrorLocation(in data: Data) -> String? {
        JSONSyntaxLocator.firstError(in: Array(data)).map(\.description)
    }

    /// The configuration as the JSON object a `config.json` would hold (every key, with its value).
    public var jsonObject: [String: Any] {
        [
            "interface": interface.map { $0 as Any } ?? NSNull(),
            "deliveryPort": deliveryPort, "beaconPort": beaconPort,
            "ssdpMulticastAddress": ssdpMulticastAddress, "ssdpPort": ssdpPort,
            "beaconProfile": beaconProfile.rawValue, "beaconValiditySeconds": beaconValiditySeconds,
            "defaultItemExpirySeconds": defaultItemExpirySeconds, "logLevel": logLevel.rawValue, "dhGroup": dhGroup.rawValue,
            "maxFramePayloadBytes": limits.maxFramePayloadBytes, "chunkBytes": limits.chunkBytes,
            "maxNameBytes": limits.maxNameBytes, "maxItemBytes": limits.maxItemBytes,
            "maxTextBytes": limits.maxTextBytes, "blockBytes": limits.blockBytes,
            "writebackBytes": limits.writebackBytes, "readAheadBlocks": limits.readAheadBlocks, "inboundFrames": limits.inboundFrames,
            "directWrites": limits.directWrites, "progressWindowBytes": limits.progressWindowBytes,
            "writeIntervalMs": limits.writeInterval.wholeMilliseconds, "maxBatchItems": limits.maxBatchItems,
            "batchesInFlight": limits.batchesInFlight,
            "idleTimeoutSeconds": limits.idleTimeout.components.seconds,
            "lingerSeconds": limits.lingerInterval.components.seconds,
            "partialRetentionSeconds": limits.partialRetention.components.seconds,
            "minimumFreeBytes": limits.minimumFreeBytes, "noSpaceRetrySeconds": limits.noSpaceRetryBase.components.seconds,
            "noSpaceRetryMaxSeconds": limits.noSpaceRetryCap.components.seconds,
            "wifi": wifi, "bluetooth": bluetooth, "bluetoothAdapter": bluetoothAdapter.map { $0 as Any } ?? NSNull(),
            "bluetoothMakeConnectable": bluetoothMakeConnectable,
        ]
    }
}

/// A configuration file that cannot be used: which file, which key (if one is to blame), and why.
public struct ConfigurationError: Error, Hashable, CustomStringConvertible {
    /// What is wrong.
    public enum Problem: Hashable, Sendable {
        /// The file exists but cannot be read.
        case unreadable(String)
        /// The file is not a JSON object.
        case notJSON(String)
        /// A key this version does not know.
        case unknownKey
        /// The key's value has the wrong JSON type.
        case wrongType(expected: String)
        /// The key's value is of the right type but not allowed.
        case invalidValue(String)
    }

    /// The configuration file.
    public let path: String
    /// The offending key, when the problem is one key's.
    public let key: String?
    /// The problem.
    public let problem: Problem

    public var description: String {
        let place = key.map { "\(path): key \"\($0)\"" } ?? path
        switch problem {
        case .unreadable(let reason): return "cannot read configuration \(place): \(reason)"
        case .notJSON(let reason): return "configuration \(place) is not a JSON object: \(reason)"
        case .unknownKey: return "configuration \(place): unknown key (known: \(NodeConfiguration.keys.joined(separator: ", ")))"
        case .wrongType(let expected): return "configuration \(place): expected \(expected)"
        case .invalidValue(let reason): return "configuration \(place): \(reason)"
        }
    }
}

/// One JSON value of a configuration file, decoded strictly (an integer is never a boolean).
private enum JSONValue: Decodable {
    case null, bool(Bool), integer(Int), number(Double), string(String), array, object

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Int.self) { self = .integer(value) }
        else if let value = try? container.decode(Double.self) { self = .number(value) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else if (try? container.decode([JSONValue].self)) != nil { self = .array }
        else { _ = try container.decode([String: JSONValue].self); self = .object }
    }
}

extension DecodingError {
    /// A one-line reason without the coding path noise.
    var summary: String {
        switch self {
        case .dataCorrupted(let context), .keyNotFound(_, let context), .typeMismatch(_, let context),
             .valueNotFound(_, let context):
            if let underlying = context.underlyingError { return "\(context.debugDescription) (\(underlying.localizedDescription))" }
            return context.debugDescription
        @unknown default:
            return "\(self)"
        }
    }
}

/// Typed access to the keys of a parsed configuration object.
private struct ConfigurationFields {
    let dictionary: [String: JSONValue]
    let path: String

    func error(_ key: String, _ problem: ConfigurationError.Problem) -> ConfigurationError {
        ConfigurationError(path: path, key: key, problem: problem)
    }

    func integer(_ key: String, default value: Int, range: ClosedRange<Int>) throws -> Int {
        guard let raw = dictionary[key] else { return value }
        guard case .integer(let number) = raw else { throw error(key, .wrongType(expected: "an integer")) }
        guard range.contains(number) else {
            throw error(key, .invalidValue("\(number) is outside \(range.lowerBound)...\(range.upperBound)"))
        }
        return number
    }

    func string(_ key: String, default value: String, validate: (String) -> String?) throws -> String {
        guard let raw = dictionary[key] else { return value }
        guard case .string(let string) = raw else { throw error(key, .wrongType(expected: "a string")) }
        if let reason = validate(string) { throw error(key, .invalidValue("\"\(string)\" \(reason)")) }
        return string
    }

    func bool(_ key: String, default value: Bool) throws -> Bool {
        guard let raw = dictionary[key] else { return value }
        guard case .bool(let flag) = raw else { throw error(key, .wrongType(expected: "true or false")) }
        return flag
    }

    func optionalString(_ key: String) throws -> String? {
        switch dictionary[key] {
        case nil, .null?: return nil
        case .string(let string)? where !string.isEmpty: return string
        default: throw error(key, .wrongType(expected: "a non-empty string or null"))
        }
    }
}
