import NIOConcurrencyHelpers
import NIOCore

/// How to reach BlueZ.
public struct BlueZConfiguration: Sendable {
    /// The address of the bus bluetoothd is on (normally the system bus,
    /// `unix:path=/run/dbus/system_bus_socket`; tests pass a private bus).
    public var busAddress: String
    /// The adapter to use (`hci0`); `nil` takes the first one BlueZ lists.
    public var adapterName: String?
    /// The longest any D-Bus call waits for its reply (a hung bluetoothd becomes an error, not a hang).
    public var callTimeout: Duration = .seconds(5)
    /// Where this client exports its objects (the advertisement and the RFCOMM profile).
    public var objectPathPrefix: String = "/org/thaliproject/ble"
    /// Whether the discovery filter names the Thali UUID (BlueZ then reports only matching devices).
    /// Off by default: bluetoothd (5.66, measured over real controllers) matches the filter against
    /// advertised UUID lists only, not service-data UUIDs, so with it on a Thali advertisement (the UUID
    /// in service data alone) is never reported. The client filters by itself: it decodes every report.
    public var filterByServiceUUID: Bool = false
    /// The RFCOMM service UUID registered with `ProfileManager1` (the Thali UUID by default).
    public var profileUUID: String = ThaliAdvertisement.serviceUUIDString
    /// DoS limits (advertisement rate, tracked peers).
    public var limits = BluetoothBindingLimits()

    /// A configuration for the bus at `busAddress`.
    public init(busAddress: String, adapterName: String? = nil) {
        self.busAddress = busAddress
        self.adapterName = adapterName
    }
}

/// Why a BlueZ operation failed.
public enum BlueZError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Nobody owns `org.bluez` on the bus: bluetoothd is not running.
    case bluezNotRunning
    /// bluetoothd left the bus while we were using it.
    case bluezVanished
    /// There is no Bluetooth adapter (or not the one named).
    case noAdapter(named: String?)
    /// The adapter is powered off.
    case adapterPoweredOff(adapter: String)
    /// A call got no reply in time.
    case timedOut(method: String)
    /// The bus connection is gone.
    case busDisconnected
    /// BlueZ refused a call.
    case refused(method: String, name: String, message: String)
    /// BlueZ answered in a shape we do not understand.
    case unexpectedReply(String)
    /// The bus could not be reached.
    case busUnavailable(String)

    public var description: String {
        switch self {
        case .bluezNotRunning: return "bluetoothd is not running (nobody owns org.bluez on the bus)"
        case .bluezVanished: return "bluetoothd left the bus"
        case .noAdapter(let name): return name.map { "no Bluetooth adapter named \($0)" } ?? "no Bluetooth adapter"
        case .adapterPoweredOff(let adapter): return "Bluetooth adapter \(adapter) is powered off"
        case .timedOut(let method): return "BlueZ did not answer \(method) in time"
        case .busDisconnected: return "the D-Bus connection to BlueZ is closed"
        case .refused(let method, let name, let message): return "BlueZ refused \(method): \(name): \(message)"
        case .unexpectedReply(let what): return "unexpected reply from BlueZ: \(what)"
        case .busUnavailable(let why): return "cannot reach the bus: \(why)"
        }
    }
}

/// A Bluetooth adapter as BlueZ describes it.
public struct BlueZAdapter: Hashable, Sendable {
    /// The adapter's object path (`/org/bluez/hci0`).
    public var path: String
    /// The adapter's address, if BlueZ gave one.
    public var address: BluetoothAddress?
    /// Whether it is powered.
    public var powered: Bool

    /// The kernel's index of the adapter (`N` of `hciN`, the last component of the path), if it has one.
    public var index: Int? {
        guard let name = path.split(separator: "/").last, name.hasPrefix("hci") else { return nil }
        return Int(name.dropFirst(3))
    }
}

/// A Thali peer found by scanning.
public struct ThaliPeerDiscovery: Hashable, Sendable {
    /// The address the advertisement came from (for Android, a random BLE address that changes with
    /// every beacon change).
    public var advertiserAddress: BluetoothAddress
    /// What the peer advertised.
    public var advertisement: ThaliAdvertisement

    /// The Bluetooth address to connect to over RFCOMM, if the peer offers one.
    public var peerAddress: BluetoothAddress? { advertisement.bluetoothAddress }
}

/// The Thali BLE binding's use of BlueZ over D-Bus: advertise our `ThaliAdvertisement`, scan for others,
/// and register the RFCOMM server profile. Every call has a deadline; a missing bluetoothd, a missing
/// or powered-off adapter are `BlueZError`s.
public final class BlueZClient: Sendable {
    /// What the scanner has counted.
    public struct ScanCounters: Hashable, Sendable {
        /// The rate gate's counters (accepted, dropped, cool-downs).
        public var rate = AdvertisementRateGate.Counters()
        /// Device reports that carried Thali data and were decoded.
        public var thaliReports = 0
        /// Device reports without Thali data (ignored).
        public var otherReports = 0
        /// Thali data that did not decode (ignored).
        public var malformedReports = 0
    }

    private struct State {
        var advertisement: ThaliAdvertisement?
        var advertisementRegistered = false
        var adapterPath: String?
        var scanContinuation: AsyncThrowingStream<ThaliPeerDiscovery, any Error>.Continuation?
        var scanning = false
        var subscriptions: [Int] = []
        var gate: AdvertisementRateGate
        var counters = ScanCounters()
        var seen: [BluetoothAddress: ThaliAdvertisement] = [:]
        var seenOrder: [BluetoothAddress] = []
        var deviceAddresses: [String: BluetoothAddress] = [:]
        var profileHandler: (@Sendable (BluetoothSocket) -> Void)?
    }

    /// The configuration in use.
    public let configuration: BlueZConfiguration
    private let bus: DBusClient
    private let state: NIOLockedValueBox<State>

    static let service = "org.bluez"
    static let adapterInterface = "org.bluez.Adapter1"
    static let deviceInterface = "org.bluez.Device1"
    static let advertisingManagerInterface = "org.bluez.LEAdvertisingManager1"
    static let advertisementInterface = "org.bluez.LEAdvertisement1"
    static let profileManagerInterface = "org.bluez.ProfileManager1"
    static let profileInterface = "org.bluez.Profile1"
    static let propertiesInterface = "org.freedesktop.DBus.Properties"
    static let objectManagerInterface = "org.freedesktop.DBus.ObjectManager"

    /// Connects to the bus (not yet to BlueZ: that happens on first use).
    public init(configuration: BlueZConfiguration) throws {
        self.configuration = configuration
        do {
            self.bus = try DBusClient(address: configuration.busAddress, defaultTimeout: configuration.callTimeout)
        } catch {
            throw BlueZError.busUnavailable("\(error)")
        }
        self.state = NIOLockedValueBox(State(gate: AdvertisementRateGate(limits: configuration.limits)))
    }

    /// Closes the bus connection (BlueZ drops our advertisement and profile with it).
    public func close() {
        let continuation = state.withLockedValue { state in
            defer { state.scanContinuation = nil }
            return state.scanContinuation
        }
        continuation?.finish()
        bus.close()
    }

    /// The unique bus name of this client (what BlueZ sees as the owner of our objects).
    public var uniqueBusName: String { bus.uniqueName }

    /// The scanner's counters.
    public var scanCounters: ScanCounters {
        state.withLockedValue { state in
            var counters = state.counters
            counters.rate = state.gate.counters
            return counters
        }
    }

    var advertisementPath: String { configuration.objectPathPrefix + "/advertisement0" }
    var profilePath: String { configuration.objectPathPrefix + "/profile0" }

    // MARK: Calls

    private func call(_ path: String, _ interface: String, _ member: String, _ arguments: [DBusValue] = [])
        async throws -> [DBusValue]
    {
        do {
            return try await bus.call(destination: Self.service, path: path, interface: interface, member: member,
                                      arguments: arguments)
        } catch let error as DBusClientError {
            throw Self.translate(error, method: "\(interface).\(member)", path: path)
        }
    }

    static func translate(_ error: DBusClientError, method: String, path: String) -> BlueZError {
        switch error {
        case .remote(let name, let message):
            switch name {
            case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
                return .bluezNotRunning
            case "org.freedesktop.DBus.Error.NoReply":
                return .bluezVanished
            case "org.freedesktop.DBus.Error.UnknownObject":
                return .noAdapter(named: path)
            case "org.bluez.Error.NotReady":
                return .adapterPoweredOff(adapter: path)
            default:
                return .refused(method: method, name: name, message: message)
            }
        case .timedOut: return .timedOut(method: method)
        case .disconnected: return .busDisconnected
        default: return .unexpectedReply("\(error)")
        }
    }

    // MARK: Adapter

    /// Finds the adapter (the named one, or else the first powered one) and checks that it is powered.
    /// - Throws: `.bluezNotRunning`, `.noAdapter`, `.adapterPoweredOff` (naming the first adapter when
    ///   none is powered), `.timedOut`.
    public func adapter() async throws -> BlueZAdapter {
        let objects = try await managedObjects()
        let adapters = objects.compactMap { path, interfaces -> BlueZAdapter? in
            guard let properties = interfaces[Self.adapterInterface] else { return nil }
            return BlueZAdapter(path: path, address: properties["Address"]?.string.flatMap { BluetoothAddress($0) },
                                powered: properties["Powered"]?.bool ?? false)
        }.sorted { $0.path < $1.path }
        let chosen: BlueZAdapter?
        if let name = configuration.adapterName {
            chosen = adapters.first { $0.path.hasSuffix("/" + name) }
        } else {
            chosen = adapters.first { $0.powered } ?? adapters.first
        }
        guard let adapter = chosen else { throw BlueZError.noAdapter(named: configuration.adapterName) }
        guard adapter.powered else { throw BlueZError.adapterPoweredOff(adapter: adapter.path) }
        state.withLockedValue { $0.adapterPath = adapter.path }
        for (path, interfaces) in objects where path.hasPrefix(adapter.path + "/") {
            if let device = interfaces[Self.deviceInterface] { deviceReport(path: path, properties: device) }
        }
        return adapter
    }

    /// Sets the adapter's `Discoverable` property. With the kernel's connection control (every kernel
    /// since 3.17) bluetoothd keeps an adapter connectable (page scan on) only while it is discoverable:
    /// turning `Discoverable` on turns page scan on, and page scan stays on when the discoverable period
    /// (`DiscoverableTimeout`, 180 s unless configured) ends; turning it off by hand turns page scan off
    /// too (measured with bluetoothd 5.66, spec/ble-binding.md §7).
    public func setDiscoverable(_ discoverable: Bool) async throws {
        let adapter = try await adapter()
        _ = try await call(adapter.path, Self.propertiesInterface, "Set",
                           [.string(Self.adapterInterface), .string("Discoverable"), .variant(.boolean(discoverable))])
    }

    /// `ObjectManager.GetManagedObjects` as path → interface → property → value.
    private func managedObjects() async throws -> [String: [String: [String: DBusValue]]] {
        let reply = try await call("/", Self.objectManagerInterface, "GetManagedObjects")
        guard let entries = reply.first?.entries else { throw BlueZError.unexpectedReply("GetManagedObjects") }
        var objects: [String: [String: [String: DBusValue]]] = [:]
        for entry in entries {
            guard let path = entry.key.string, let interfaces = entry.value.entries else { continue }
            var byInterface: [String: [String: DBusValue]] = [:]
            for interface in interfaces {
                guard let name = interface.key.string, let properties = interface.value.stringKeyedDictionary else { continue }
                byInterface[name] = properties
            }
            objects[path] = byInterface
        }
        return objects
    }

    // MARK: Advertising

    /// Advertises `advertisement` (broadcast, Service Data of the Thali UUID). Called again with a new
    /// value it unregisters and registers again, as the seed requires on every beacon change.
    public func advertise(_ advertisement: ThaliAdvertisement) async throws {
        let adapter = try await adapter()
        try exportAdvertisement()
        let wasRegistered = state.withLockedValue { state in
            state.advertisement = advertisement
            return state.advertisementRegistered
        }
        if wasRegistered {
            _ = try? await call(adapter.path, Self.advertisingManagerInterface, "UnregisterAdvertisement",
                                [.objectPath(advertisementPath)])
            state.withLockedValue { $0.advertisementRegistered = false }
        }
        _ = try await call(adapter.path, Self.advertisingManagerInterface, "RegisterAdvertisement",
                           [.objectPath(advertisementPath), .properties([])])
        state.withLockedValue { $0.advertisementRegistered = true }
    }

    /// Stops advertising.
    public func stopAdvertising() async throws {
        let (registered, path) = state.withLockedValue { ($0.advertisementRegistered, $0.adapterPath) }
        guard registered, let path else { return }
        _ = try await call(path, Self.advertisingManagerInterface, "UnregisterAdvertisement", [.objectPath(advertisementPath)])
        state.withLockedValue {
            $0.advertisementRegistered = false
            $0.advertisement = nil
        }
        bus.unexport(path: advertisementPath)
    }

    /// The `LEAdvertisement1` properties of `advertisement`. Only Service Data, no ServiceUUIDs: a
    /// 128-bit UUID list would add 18 octets and push the payload past 31 (see `spec/ble-binding.md`).
    static func advertisementProperties(_ advertisement: ThaliAdvertisement) -> [(String, DBusValue)] {
        [
            ("Type", .string("broadcast")),
            ("ServiceData", .dictionary(keySignature: "s", valueSignature: "v", [
                DBusDictionaryEntry(key: .string(ThaliAdvertisement.serviceUUIDString),
                                    value: .variant(.bytes(advertisement.serviceDataValue))),
            ])),
        ]
    }

    private func exportAdvertisement() throws {
        let state = self.state
        try bus.export(path: advertisementPath) { call in
            let current = state.withLockedValue { $0.advertisement }
            switch (call.interface, call.member) {
            case (Self.propertiesInterface, "GetAll"):
                guard call.arguments.first?.string == Self.advertisementInterface, let current else {
                    return .values([.properties([])])
                }
                return .values([.properties(Self.advertisementProperties(current))])
            case (Self.propertiesInterface, "Get"):
                guard call.arguments.count == 2, call.arguments[0].string == Self.advertisementInterface,
                      let name = call.arguments[1].string, let current,
                      let value = Self.advertisementProperties(current).first(where: { $0.0 == name })?.1
                else {
                    return .error(name: "org.freedesktop.DBus.Error.InvalidArgs", message: "no such property")
                }
                return .values([.variant(value)])
            case (Self.advertisementInterface, "Release"):
                state.withLockedValue { $0.advertisementRegistered = false }
                return .values([])
            case ("org.freedesktop.DBus.Introspectable", "Introspect"):
                return .values([.string(Self.advertisementIntrospection)])
            default:
                return .error(name: "org.freedesktop.DBus.Error.UnknownMethod", message: "\(call.interface).\(call.member)")
            }
        }
    }

    static let advertisementIntrospection = """
        <node><interface name="org.bluez.LEAdvertisement1"><method name="Release"/>\
        <property name="Type" type="s" access="read"/><property name="ServiceData" type="a{sv}" access="read"/>\
        </interface><interface name="org.freedesktop.DBus.Properties"><method name="GetAll">\
        <arg name="interface" type="s" direction="in"/><arg name="properties" type="a{sv}" direction="out"/>\
        </method></interface></node>
        """

    // MARK: Scanning

    /// Starts discovery: subscribes to BlueZ's object signals, sets the discovery filter (Thali UUID,
    /// LE, duplicates reported) and starts discovery. The stream yields each Thali peer when first seen
    /// and whenever its advertisement changes; it ends with `BlueZError.bluezVanished` if bluetoothd
    /// leaves the bus. Other devices are ignored. Too many reports switch discovery off for a cool-down.
    public func scan() async throws -> AsyncThrowingStream<ThaliPeerDiscovery, any Error> {
        let (stream, continuation) = AsyncThrowingStream.makeStream(
            of: ThaliPeerDiscovery.self, bufferingPolicy: .bufferingNewest(configuration.limits.maxTrackedPeers))
        state.withLockedValue {
            $0.scanContinuation?.finish()
            $0.scanContinuation = continuation
            $0.scanning = true
        }
        do {
            try await subscribeToBlueZ()
            let adapter = try await adapter()
            var filter: [(String, DBusValue)] = [("Transport", .string("le")), ("DuplicateData", .boolean(true))]
            if configuration.filterByServiceUUID {
                filter.insert(("UUIDs", .strings([ThaliAdvertisement.serviceUUIDString])), at: 0)
            }
            _ = try await call(adapter.path, Self.adapterInterface, "SetDiscoveryFilter", [.properties(filter)])
            _ = try await call(adapter.path, Self.adapterInterface, "StartDiscovery")
        } catch {
            state.withLockedValue {
                $0.scanning = false
                $0.scanContinuation = nil
            }
            continuation.finish(throwing: error)
            throw error
        }
        return stream
    }

    /// Stops discovery and ends the scan stream.
    public func stopScanning() async throws {
        let (continuation, path) = state.withLockedValue { state in
            defer {
                state.scanContinuation = nil
                state.scanning = false
            }
            return (state.scanContinuation, state.adapterPath)
        }
        continuation?.finish()
        if let path { _ = try await call(path, Self.adapterInterface, "StopDiscovery") }
    }

    private func subscribeToBlueZ() async throws {
        let already = state.withLockedValue { !$0.subscriptions.isEmpty }
        guard !already else { return }
        var ids: [Int] = []
        ids.append(try await bus.subscribe(
            matchRule: "type='signal',sender='org.bluez',interface='\(Self.objectManagerInterface)',member='InterfacesAdded'",
            interface: Self.objectManagerInterface, member: "InterfacesAdded"
        ) { [weak self] signal in
            guard let self, signal.arguments.count >= 2, let path = signal.arguments[0].string,
                  let interfaces = signal.arguments[1].entries else { return }
            for interface in interfaces where interface.key.string == Self.deviceInterface {
                if let properties = interface.value.stringKeyedDictionary { self.deviceReport(path: path, properties: properties) }
            }
        })
        ids.append(try await bus.subscribe(
            matchRule: "type='signal',sender='org.bluez',interface='\(Self.propertiesInterface)',member='PropertiesChanged',arg0='\(Self.deviceInterface)'",
            interface: Self.propertiesInterface, member: "PropertiesChanged"
        ) { [weak self] signal in
            guard let self, signal.arguments.count >= 2, signal.arguments[0].string == Self.deviceInterface,
                  let properties = signal.arguments[1].stringKeyedDictionary else { return }
            self.deviceReport(path: signal.path, properties: properties)
        })
        ids.append(try await bus.subscribe(
            matchRule: "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='org.bluez'",
            interface: "org.freedesktop.DBus", member: "NameOwnerChanged"
        ) { [weak self] signal in
            guard let self, signal.arguments.count == 3, signal.arguments[0].string == Self.service,
                  signal.arguments[2].string == "" else { return }
            self.bluezVanished()
        })
        bus.onDisconnect { [weak self] in
            guard let self else { return }
            let continuation = self.state.withLockedValue { state in
                defer { state.scanContinuation = nil; state.scanning = false }
                return state.scanContinuation
            }
            continuation?.finish(throwing: BlueZError.busDisconnected)
        }
        state.withLockedValue { $0.subscriptions = ids }
    }

    private func bluezVanished() {
        let continuation = state.withLockedValue { state in
            defer {
                state.scanContinuation = nil
                state.scanning = false
                state.advertisementRegistered = false
            }
            return state.scanContinuation
        }
        continuation?.finish(throwing: BlueZError.bluezVanished)
    }

    /// One report about a device (its properties as added or changed). Runs on the D-Bus thread.
    func deviceReport(path: String, properties: [String: DBusValue]) {
        let serviceData = properties["ServiceData"]?.stringKeyedDictionary
        let manufacturerData = properties["ManufacturerData"]?.entries
        let address = properties["Address"]?.string.flatMap { BluetoothAddress($0) }
        enum Outcome {
            case ignore
            case coolDown(NIODeadline)
            case yield(ThaliPeerDiscovery, AsyncThrowingStream<ThaliPeerDiscovery, any Error>.Continuation)
        }
        let outcome: Outcome = state.withLockedValue { state in
            if let address { state.deviceAddresses[path] = address }
            if state.deviceAddresses.count > configuration.limits.maxTrackedPeers * 4 {
                state.deviceAddresses = address.map { [path: $0] } ?? [:]
            }
            guard state.scanning, let continuation = state.scanContinuation,
                  serviceData != nil || manufacturerData != nil else { return .ignore }
            switch state.gate.admit() {
            case .accept: break
            case .coolingDown: return .ignore
            case .startCoolDown(let until): return .coolDown(until)
            }
            let decoded: ThaliAdvertisement?
            do {
                if let value = serviceData?[ThaliAdvertisement.serviceUUIDString]?.byteArray {
                    decoded = try ThaliAdvertisement.decode(serviceData: value)
                } else if let entry = manufacturerData?.first(where: { $0.key == .uint16(ThaliAdvertisement.androidCompanyIdentifier) }),
                          let value = entry.value.byteArray
                {
                    decoded = try ThaliAdvertisement.decode(manufacturerData: value)
                } else {
                    decoded = nil
                }
            } catch {
                state.counters.malformedReports += 1
                return .ignore
            }
            guard let advertisement = decoded else {
                state.counters.otherReports += 1
                return .ignore
            }
            guard let advertiser = state.deviceAddresses[path] ?? Self.address(fromDevicePath: path) else {
                state.counters.malformedReports += 1
                return .ignore
            }
            state.counters.thaliReports += 1
            if state.seen[advertiser] == advertisement { return .ignore }
            if state.seen[advertiser] == nil {
                state.seenOrder.append(advertiser)
                if state.seenOrder.count > configuration.limits.maxTrackedPeers {
                    state.seen[state.seenOrder.removeFirst()] = nil
                }
            }
            state.seen[advertiser] = advertisement
            return .yield(ThaliPeerDiscovery(advertiserAddress: advertiser, advertisement: advertisement), continuation)
        }
        switch outcome {
        case .ignore: break
        case .yield(let discovery, let continuation): continuation.yield(discovery)
        case .coolDown(let until): startCoolDown(until: until)
        }
    }

    /// Makes the next report from `advertiser` a discovery again even if its advertisement has not
    /// changed: for a caller whose connection to it ended and that wants to hear when it is still there.
    public func forget(_ advertiser: BluetoothAddress) {
        state.withLockedValue { state in
            guard state.seen.removeValue(forKey: advertiser) != nil else { return }
            state.seenOrder.removeAll { $0 == advertiser }
        }
    }

    /// Too many advertisements: discovery off until `until`, then on again if still scanning.
    private func startCoolDown(until: NIODeadline) {
        let pause = until - NIODeadline.now()
        Task { [self] in
            guard let path = state.withLockedValue({ $0.adapterPath }) else { return }
            _ = try? await call(path, Self.adapterInterface, "StopDiscovery")
            try? await Task.sleep(nanoseconds: UInt64(max(0, pause.nanoseconds)))
            guard state.withLockedValue({ $0.scanning }) else { return }
            _ = try? await call(path, Self.adapterInterface, "StartDiscovery")
        }
    }

    /// BlueZ names device objects `.../dev_AA_BB_CC_DD_EE_FF`.
    static func address(fromDevicePath path: String) -> BluetoothAddress? {
        guard let last = path.split(separator: "/").last, last.hasPrefix("dev_") else { return nil }
        return BluetoothAddress(last.dropFirst(4).split(separator: "_", omittingEmptySubsequences: false).joined(separator: ":"))
    }

    // MARK: RFCOMM server profile

    /// Registers an RFCOMM server with `ProfileManager1.RegisterProfile` (insecure, as the seed's
    /// Android code used). BlueZ hands each incoming connection's socket to the exported `Profile1`
    /// object's `NewConnection`, which passes it on to `onConnection` (typically
    /// `BluetoothRelayServer.handle`).
    public func registerProfile(channel: UInt8, onConnection: @escaping @Sendable (BluetoothSocket) -> Void) async throws {
        state.withLockedValue { $0.profileHandler = onConnection }
        let state = self.state
        try bus.export(path: profilePath) { call in
            switch (call.interface, call.member) {
            case (Self.profileInterface, "NewConnection"):
                guard call.arguments.count >= 2, let device = call.arguments[0].string,
                      case .unixFD(let fd) = call.arguments[1].unwrapped
                else {
                    for case .unixFD(let fd) in call.arguments { _ = closeDescriptor(fd) }
                    return .error(name: "org.bluez.Error.InvalidArguments", message: "expected (o, h, a{sv})")
                }
                let (handler, known) = state.withLockedValue { ($0.profileHandler, $0.deviceAddresses[device]) }
                guard let address = known ?? Self.address(fromDevicePath: device), let handler else {
                    _ = closeDescriptor(fd)
                    return .error(name: "org.bluez.Error.Rejected", message: "unknown device \(device)")
                }
                handler(BluetoothSocket(adoptingDescriptor: fd, remoteAddress: address))
                return .values([])
            case (Self.profileInterface, "RequestDisconnection"), (Self.profileInterface, "Release"):
                return .values([])
            default:
                return .error(name: "org.freedesktop.DBus.Error.UnknownMethod", message: "\(call.interface).\(call.member)")
            }
        }
        _ = try await adapter()
        _ = try await call("/org/bluez", Self.profileManagerInterface, "RegisterProfile", [
            .objectPath(profilePath), .string(configuration.profileUUID),
            .properties([
                ("Name", .string("Thali")),
                ("Role", .string("server")),
                ("Channel", .uint16(UInt16(channel))),
                ("RequireAuthentication", .boolean(false)),
                ("RequireAuthorization", .boolean(false)),
                ("AutoConnect", .boolean(false)),
            ]),
        ])
    }
}
