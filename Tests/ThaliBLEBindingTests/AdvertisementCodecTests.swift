import Testing
@testable import ThaliBLEBinding

/// Parses a hex string with optional spaces.
func hex(_ text: String) -> [UInt8] {
    let digits = text.filter { !$0.isWhitespace }
    var bytes: [UInt8] = []
    var index = digits.startIndex
    while index < digits.endIndex {
        let next = digits.index(index, offsetBy: 2)
        bytes.append(UInt8(digits[index..<next], radix: 16)!)
        index = next
    }
    return bytes
}

/// A small deterministic generator (SplitMix64) so the fuzz-style tests are reproducible.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

let sampleAddress = BluetoothAddress("A0:B1:C2:D3:E4:F5")!
/// The Thali service UUID little-endian, as it sits in an AD structure.
let uuidLE = "51fb475a808b5d813a4b19d3d14aa4b6"

@Suite struct BluetoothAddressTests {
    @Test func parsesAndPrints() throws {
        let address = try #require(BluetoothAddress("a0:b1:c2:d3:e4:f5"))
        #expect(address.description == "A0:B1:C2:D3:E4:F5")
        #expect(address.octets == [0xA0, 0xB1, 0xC2, 0xD3, 0xE4, 0xF5])
        #expect(address.reversedOctets == [0xF5, 0xE4, 0xD3, 0xC2, 0xB1, 0xA0])
        #expect(BluetoothAddress("A0-B1-C2-D3-E4-F5") == address)
    }

    @Test(arguments: ["", "A0:B1:C2:D3:E4", "A0:B1:C2:D3:E4:F5:00", "A0:B1:C2:D3:E4:G5", "A0:B1:C2:D3:E4:F", "A0B1:C2:D3:E4:F5:"])
    func rejectsMalformedText(_ text: String) {
        #expect(BluetoothAddress(text) == nil)
    }
}

@Suite struct AdvertisementCodecTests {
    @Test func encodesOurLayoutIn28Octets() {
        let bytes = ThaliAdvertisement(payload: .bluetoothAddress(sampleAddress)).advertisingData()
        #expect(bytes.count == 28)
        #expect(bytes == hex("020106" + "1821" + uuidLE + "00" + "a0b1c2d3e4f5"))
        #expect(bytes.count <= AdvertisingData.legacyMaximumLength)
    }

    @Test func encodesIOSDevice() {
        let bytes = ThaliAdvertisement(payload: .iOSDevice).advertisingData()
        #expect(bytes == hex("020106" + "1221" + uuidLE + "01"))
    }

    @Test func theSeedsLayoutDoesNotFit() {
        // Flags(3) + 128-bit UUID list(18) + 16-bit service data(2 + 2 + 7) = 32 > 31.
        let seedLayout = AdvertisingData.serialize([
            ADStructure(type: 0x01, data: [0x06]),
            ADStructure(type: 0x06, data: hex(uuidLE)),
            ADStructure(type: 0x16, data: [0x00, 0x00] + [0x00] + sampleAddress.octets),
        ])
        #expect(seedLayout.count == 32)
        #expect(throws: AdvertisingDataError(.tooLong(length: 32, limit: 31))) {
            try AdvertisingData.parse(seedLayout)
        }
    }

    @Test func roundTripsOurForms() throws {
        for payload in [ThaliAdvertisement.Payload.bluetoothAddress(sampleAddress), .iOSDevice] {
            let advertisement = ThaliAdvertisement(payload: payload)
            let decoded = try ThaliAdvertisement.decode(advertisingData: advertisement.advertisingData())
            #expect(decoded == advertisement)
        }
    }

    @Test func decodesOursAmongOtherStructures() throws {
        // A local name before ours, zero padding after.
        let payload = hex("020106" + "03094142" + "1221" + uuidLE + "01" + "0000")
        let decoded = try ThaliAdvertisement.decode(advertisingData: payload)
        #expect(decoded.payload == .iOSDevice)
    }

    @Test func decodesAndroidServiceDataWithGeneration() throws {
        let decoded = try ThaliAdvertisement.decode(serviceData: hex("2a a0b1c2d3e4f5"))
        #expect(decoded == ThaliAdvertisement(payload: .bluetoothAddress(sampleAddress), generation: 0x2A, encoding: .serviceData))
        // The same inside a full (extended-length) Android payload: 128-bit UUID list + service data.
        let payload = hex("1107" + uuidLE + "1821" + uuidLE + "07a0b1c2d3e4f5")
        #expect(payload.count == 43)
        let fromPayload = try ThaliAdvertisement.decode(advertisingData: payload, maximumLength: AdvertisingData.extendedMaximumLength)
        #expect(fromPayload.generation == 7)
        #expect(fromPayload.bluetoothAddress == sampleAddress)
    }

    @Test func decodesAndroidManufacturerData() throws {
        let value = hex("0215" + "b6a44ad1d3194b3a815d8b805a47fb51" + "03" + "a0b1c2d3e4f5")
        let decoded = try ThaliAdvertisement.decode(manufacturerData: value)
        #expect(decoded == ThaliAdvertisement(payload: .bluetoothAddress(sampleAddress), generation: 3, encoding: .manufacturerData))
        // As a raw AD structure: company 7413 = 0x1CF5, little-endian.
        let payload = hex("1cff" + "f51c") + value
        #expect(payload.count == 29)
        #expect(try ThaliAdvertisement.decode(advertisingData: payload) == decoded)
    }

    @Test func serviceDataWinsOverManufacturerData() throws {
        let manufacturer = hex("1cff" + "f51c" + "0215" + "b6a44ad1d3194b3a815d8b805a47fb51" + "03" + "010203040506")
        let decoded = try ThaliAdvertisement.decode(advertisingData: manufacturer, maximumLength: 64)
        #expect(decoded.bluetoothAddress == BluetoothAddress("01:02:03:04:05:06"))
        let both = hex("1221" + uuidLE + "01") + manufacturer
        #expect(try ThaliAdvertisement.decode(advertisingData: both, maximumLength: 64).payload == .iOSDevice)
    }

    // MARK: Malformed input

    @Test func rejectsTruncatedStructure() {
        #expect(throws: AdvertisingDataError(.truncatedStructure(declaredLength: 0x18, available: 5), offset: 3)) {
            try AdvertisingData.parse(hex("020106" + "1821" + "0102030405").dropLast(1))
        }
    }

    @Test func rejectsNonZeroPadding() throws {
        #expect(throws: AdvertisingDataError(.nonZeroPadding, offset: 5)) {
            try AdvertisingData.parse(hex("020106" + "0000" + "01"))
        }
        #expect(try AdvertisingData.parse(hex("020106" + "000000")) == [ADStructure(type: 1, data: [6])])
    }

    @Test func rejectsBadFlags() {
        #expect(throws: AdvertisingDataError(.badFlagsLength(2), offset: 0)) { try AdvertisingData.parse(hex("03010600")) }
        #expect(throws: AdvertisingDataError(.badFlagsLength(0), offset: 0)) { try AdvertisingData.parse(hex("0101")) }
        #expect(throws: AdvertisingDataError(.duplicateStructure(type: 1), offset: 3)) { try AdvertisingData.parse(hex("020106020106")) }
    }

    @Test func rejectsBadUUIDList() {
        #expect(throws: AdvertisingDataError(.badUUIDListLength(15), offset: 0)) {
            try AdvertisingData.parse(hex("1006" + String(uuidLE.dropLast(2))))
        }
    }

    @Test func rejectsTooLong() {
        #expect(throws: AdvertisingDataError(.tooLong(length: 32, limit: 31))) {
            try AdvertisingData.parse([UInt8](repeating: 0, count: 32))
        }
    }

    @Test func rejectsPayloadsWithoutThali() {
        #expect(throws: AdvertisingDataError(.notThali)) { try ThaliAdvertisement.decode(advertisingData: hex("020106")) }
        // Manufacturer data of another company, service data of another 128-bit UUID.
        #expect(throws: AdvertisingDataError(.notThali)) {
            try ThaliAdvertisement.decode(advertisingData: hex("020106" + "06ff4c00021500"))
        }
        #expect(throws: AdvertisingDataError(.notThali)) {
            try ThaliAdvertisement.decode(advertisingData: hex("1221" + "00112233445566778899aabbccddeeff" + "01"))
        }
        #expect(throws: AdvertisingDataError(.duplicateStructure(type: 0x21))) {
            try ThaliAdvertisement.decode(advertisingData: hex("1221" + uuidLE + "01" + "1221" + uuidLE + "01"), maximumLength: 64)
        }
    }

    @Test(arguments: [(hex(""), AdvertisingDataError.Reason.badServiceDataLength(0)),
                      (hex("00"), .unknownServiceDataFlag(0)),
                      (hex("02"), .unknownServiceDataFlag(2)),
                      (hex("00a0b1c2d3e4"), .badServiceDataLength(6)),
                      (hex("00a0b1c2d3e4f5ff"), .badServiceDataLength(8))])
    func rejectsBadServiceData(_ value: [UInt8], _ reason: AdvertisingDataError.Reason) {
        #expect(throws: AdvertisingDataError(reason)) { try ThaliAdvertisement.decode(serviceData: value) }
    }

    @Test func rejectsBadManufacturerData() {
        let good = hex("0215" + "b6a44ad1d3194b3a815d8b805a47fb51" + "03" + "a0b1c2d3e4f5")
        var wrongPrefix = good
        wrongPrefix[1] = 0x16
        var wrongUUID = good
        wrongUUID[5] ^= 0x01
        for bad in [Array(good.dropLast()), good + [0], wrongPrefix, wrongUUID] {
            #expect(throws: AdvertisingDataError.self) { try ThaliAdvertisement.decode(manufacturerData: bad) }
        }
    }

    // MARK: Fuzz-style

    /// Every prefix of a valid payload either decodes (cut at a structure boundary) or fails with a
    /// typed error, never anything else.
    @Test func everyPrefixIsHandled() {
        let full = ThaliAdvertisement(payload: .bluetoothAddress(sampleAddress)).advertisingData()
        for cut in 0...full.count {
            let prefix = Array(full.prefix(cut))
            do {
                let structures = try AdvertisingData.parse(prefix)
                #expect(cut == 0 || cut == 3 || cut == 28, "prefix \(cut) parsed")
                _ = structures
            } catch {
                #expect(error.reason != .notThali)
            }
        }
    }

    /// Random payloads and random single-octet mutations of a valid payload: the decoder returns or
    /// throws `AdvertisingDataError`, and whatever it accepts re-encodes consistently.
    @Test func randomInputNeverCrashes() {
        var random = SplitMix64(state: 0x7431_5EED)
        let valid = ThaliAdvertisement(payload: .bluetoothAddress(sampleAddress)).advertisingData()
        var accepted = 0
        var rejected = 0
        for round in 0..<20_000 {
            var bytes: [UInt8]
            if round % 2 == 0 {
                bytes = (0..<Int.random(in: 0...40, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            } else {
                bytes = valid
                let position = Int.random(in: 0..<bytes.count, using: &random)
                bytes[position] = UInt8.random(in: 0...255, using: &random)
            }
            do {
                let decoded = try ThaliAdvertisement.decode(advertisingData: bytes)
                accepted += 1
                if decoded.encoding == .serviceData, decoded.generation == 0 {
                    #expect(try ThaliAdvertisement.decode(advertisingData: decoded.advertisingData()) == decoded)
                }
            } catch {
                rejected += 1
            }
        }
        // Mutations of the address octets keep the payload valid; mutations of the lengths do not.
        #expect(accepted > 0)
        #expect(rejected > 0)
    }

    @Test func randomAddressesRoundTrip() throws {
        var random = SplitMix64(state: 42)
        for _ in 0..<1_000 {
            let address = try #require(BluetoothAddress(octets: (0..<6).map { _ in UInt8.random(in: 0...255, using: &random) }))
            #expect(BluetoothAddress(address.description) == address)
            let advertisement = ThaliAdvertisement(payload: .bluetoothAddress(address))
            #expect(try ThaliAdvertisement.decode(advertisingData: advertisement.advertisingData()) == advertisement)
            #expect(try ThaliAdvertisement.decode(serviceData: advertisement.serviceDataValue) == advertisement)
        }
    }
}
