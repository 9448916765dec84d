import Foundation
import NIOCore
import NIOPosix
import Testing
@testable import ThaliNodeCore

@Suite("Node configuration and data directory")
struct NodeConfigurationTests {
    func write(_ text: String, in temporary: TemporaryHome) throws {
        try temporary.home.create()
        try Data(text.utf8).write(to: URL(fileURLWithPath: temporary.home.configurationPath))
    }

    @Test("no file means the documented defaults")
    func defaults() throws {
        let temporary = TemporaryHome()
        let configuration = try NodeConfiguration.load(home: temporary.home)
        #expect(configuration == NodeConfiguration())
        #expect(configuration.ssdpMulticastAddress == "239.255.255.250")
        #expect(configuration.ssdpPort == 1900)
        #expect(configuration.beaconValiditySeconds == 3600)
        #expect(configuration.defaultItemExpirySeconds == 604_800)
        #expect(configuration.logLevel == .info)
        #expect(configuration.limits == DeliveryLimits())
        #expect(configuration.wifi && !configuration.bluetooth && configuration.bluetoothAdapter == nil)
        #expect(configuration.bluetoothMakeConnectable)
        #expect(Set(configuration.jsonObject.keys) == Set(NodeConfiguration.keys))
    }

    @Test("every key is read")
    func everyKey() throws {
        let temporary = TemporaryHome()
        try write("""
            {"interface": "lo", "deliveryPort": 4000, "beaconPort": 4001, "ssdpMulticastAddress": "228.227.226.225",
             "ssdpPort": 1901, "beaconProfile": "cordova", "beaconValiditySeconds": 60, "defaultItemExpirySeconds": 120,
             "logLevel": "debug", "maxFramePayloadBytes": 8192, "chunkBytes": 4096, "maxNameBytes": 100,
             "maxItemBytes": 1000000, "maxTextBytes": 500, "blockBytes": 65536, "writebackBytes": 2097152, "readAheadBlocks": 3,
             "inboundFrames": 12, "directWrites": false, "progressWindowBytes": 1048576, "writeIntervalMs": 25,
             "maxBatchItems": 8, "idleTimeoutSeconds": 5, "lingerSeconds": 2,
             "partialRetentionSeconds": 3600, "minimumFreeBytes": 4096, "noSpaceRetrySeconds": 2, "noSpaceRetryMaxSeconds": 10,
             "wifi": false, "bluetooth": true, "bluetoothAdapter": "hci1",
             "bluetoothMakeConnectable": false}
            """, in: temporary)
        let configuration = try NodeConfiguration.load(home: temporary.home)
        #expect(configuration.interface == "lo")
        #expect(configuration.deliveryPort == 4000)
        #expect(configuration.beaconPort == 4001)
        #expect(configuration.ssdpMulticastAddress == "228.227.226.225")
        #expect(configuration.ssdpPort == 1901)
        #expect(configuration.beaconProfile == .cordova)
        #expect(configuration.beaconValiditySeconds == 60)
        #expect(configuration.defaultItemExpirySeconds == 120)
        #expect(configuration.logLevel == .debug)
        #expect(!configuration.wifi && configuration.bluetooth && configuration.bluetoothAdapter == "hci1")
        #expect(!configuration.bluetoothMakeConnectable)
        #expect(configuration.limits == DeliveryLimits(maxFramePayloadBytes: 8192, chunkBytes: 4096, maxNameBytes: 100,
                                                       maxItemBytes: 1_000_000, maxTextBytes: 500, blockBytes: 65536,
                                                       writebackBytes: 2 << 20, readAheadBlocks: 3, inboundFrames: 12, directWrites: false, progressWindowBytes: 1 << 20, writeInterval: .milliseconds(25), maxBatchItems: 8, idleTimeout: .seconds(5),
                                                       lingerInterval: .seconds(2), partialRetention: .seconds(3600), minimumFreeBytes: 4096,
                                                       noSpaceRetryBase: .seconds(2), noSpaceRetryCap: .seconds(10)))
        // What `jsonObject` writes reads back to the same configuration.
        let data = try JSONSerialization.data(withJSONObject: configuration.jsonObject)
        #expect(try NodeConfiguration.parse(data, path: "x") == configuration)
    }

    /// Bad files and the key (or none) the error must name.
    static let badFiles: [(String, String?, String)] = [
        ("{not json", nil, "notJSON"),
        ("[1, 2]", nil, "notJSON"),
        (#"{"deliveryport": 1}"#, "deliveryport", "unknownKey"),
        (#"{"deliveryPort": "80"}"#, "deliveryPort", "wrongType"),
        (#"{"deliveryPort": 1.5}"#, "deliveryPort", "wrongType"),
        (#"{"deliveryPort": true}"#, "deliveryPort", "wrongType"),
        (#"{"deliveryPort": 70000}"#, "deliveryPort", "invalidValue"),
        (#"{"beaconValiditySeconds": 86400}"#, "beaconValiditySeconds", "invalidValue"),
        (#"{"blockBytes": 100}"#, "blockBytes", "invalidValue"),
        (#"{"writeIntervalMs": 0}"#, "writeIntervalMs", "invalidValue"),
        (#"{"writebackBytes": 4096}"#, "writebackBytes", "invalidValue"),
        (#"{"readAheadBlocks": 0}"#, "readAheadBlocks", "invalidValue"),
        (#"{"inboundFrames": 1}"#, "inboundFrames", "invalidValue"),
        (#"{"directWrites": 1}"#, "directWrites", "wrongType"),
        (#"{"minimumFreeBytes": -1}"#, "minimumFreeBytes", "invalidValue"),
        (#"{"noSpaceRetrySeconds": 0}"#, "noSpaceRetrySeconds", "invalidValue"),
        (#"{"noSpaceRetrySeconds": 60, "noSpaceRetryMaxSeconds": 30}"#, "noSpaceRetryMaxSeconds", "invalidValue"),
        (#"{"progressWindowBytes": 65536}"#, "progressWindowBytes", "invalidValue"),
        (#"{"maxBatchItems": 0}"#, "maxBatchItems", "invalidValue"),
        (#"{"beaconProfile": "other"}"#, "beaconProfile", "invalidValue"),
        (#"{"logLevel": "loud"}"#, "logLevel", "invalidValue"),
        (#"{"ssdpMulticastAddress": "not-an-ip"}"#, "ssdpMulticastAddress", "invalidValue"),
        (#"{"interface": 3}"#, "interface", "wrongType"),
        (#"{"chunkBytes": 70000}"#, "chunkBytes", "invalidValue"),
        (#"{"maxFramePayloadBytes": 100}"#, "maxFramePayloadBytes", "invalidValue"),
        (#"{"bluetooth": "yes"}"#, "bluetooth", "wrongType"),
        (#"{"wifi": 0}"#, "wifi", "wrongType"),
        (#"{"wifi": false}"#, "wifi", "invalidValue"),
        (#"{"bluetooth": true, "bluetoothAdapter": ""}"#, "bluetoothAdapter", "wrongType"),
    ]

    @Test("invalid files name the file and the offending key", arguments: 0..<badFiles.count)
    func invalidFile(index: Int) throws {
        let (text, key, problem) = Self.badFiles[index]
        let temporary = TemporaryHome()
        try write(text, in: temporary)
        let error = try #require(throws: ConfigurationError.self) { try NodeConfiguration.load(home: temporary.home) }
        #expect(error.path == temporary.home.configurationPath)
        #expect(error.key == key)
        #expect("\(error.problem)".hasPrefix(problem))
        #expect(error.description.contains(temporary.home.configurationPath))
        if let key { #expect(error.description.contains("\"\(key)\"")) }
    }

    @Test("an unreadable configuration is a typed error with its path")
    func unreadable() throws {
        let temporary = TemporaryHome()
        try temporary.home.create()
        // A directory where the file should be cannot be read (chmod would not stop root).
        try FileManager.default.createDirectory(atPath: temporary.home.configurationPath, withIntermediateDirectories: true)
        let error = try #require(throws: ConfigurationError.self) { try NodeConfiguration.load(home: temporary.home) }
        #expect(error.path == temporary.home.configurationPath)
        guard case .unreadable = error.problem else { Issue.record("\(error)"); return }
    }

    @Test("the data directory: --home, else THALI_HOME, else ~/.thali")
    func homeResolution() {
        #expect(NodeHome.resolve(explicit: "/tmp/x/../y", environment: ["THALI_HOME": "/env"]).path == "/tmp/y")
        #expect(NodeHome.resolve(explicit: nil, environment: ["THALI_HOME": "/env", "HOME": "/h"]).path == "/env")
        #expect(NodeHome.resolve(explicit: nil, environment: ["HOME": "/h"]).path == "/h/.thali")
        let home = NodeHome(path: "/d")
        #expect(home.configurationPath == "/d/config.json")
        #expect(home.databasePath == "/d/node.sqlite")
    }

    @Test("an unusable data directory is a typed error")
    func unusableHome() throws {
        let temporary = TemporaryHome()
        try temporary.home.create()
        let file = temporary.home.path + "/plain-file"
        try Data().write(to: URL(fileURLWithPath: file))
        #expect(throws: NodeError.self) { try NodeStore(home: NodeHome(path: file + "/sub")) }
    }

    @Test("interface selection: a named interface, the loopback by name, or a typed error")
    func interfaceSelection() throws {
        let loopback = try NodeInterface.select(configured: "lo")
        #expect(loopback.ipv4Address == "127.0.0.1")
        #expect(throws: NodeError.noUsableInterface(name: "thali-none0")) { try NodeInterface.select(configured: "thali-none0") }
        #expect("\(NodeError.noUsableInterface(name: "thali-none0"))".contains("thali-none0"))
    }

    @Test("binding a port that is in use gives portInUse with the host and port")
    func busyPort() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let first = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(first.localAddress?.port)
        do {
            let second = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: port).get()
            try? await second.close()
            Issue.record("second bind succeeded")
        } catch {
            let mapped = NodeError.mapBindError(error, host: "127.0.0.1", port: port)
            #expect(mapped as? NodeError == .portInUse(host: "127.0.0.1", port: port))
            #expect("\(mapped)".contains("\(port)"))
        }
        try await first.close()
    }
}
