extension FrameVectorSets {
    /// BLE advertising payloads (spec/ble-binding.md, section 1), each read as a receiver with the legacy
    /// 31-octet maximum reads one: the Thali claim it carries (`frames` holds it, or nothing for a
    /// payload that is well formed but not Thali's), or a parsing error. Laid out by hand from the
    /// section's tables and ABNF; an advertisement arrives whole, so none is `incomplete`.
    public static var advertisingData: FrameVectorSet {
        let address: [UInt8] = [0xA0, 0xB1, 0xC2, 0xD3, 0xE4, 0xF5]
        let addressText = "A0:B1:C2:D3:E4:F5"
        // The Thali service UUID b6a44ad1-d319-4b3a-815d-8b805a47fb51: little-endian in service data,
        // big-endian inside Android's manufacturer data.
        let uuid: [UInt8] = [0xB6, 0xA4, 0x4A, 0xD1, 0xD3, 0x19, 0x4B, 0x3A, 0x81, 0x5D, 0x8B, 0x80, 0x5A, 0x47, 0xFB, 0x51]
        let uuidLE = Array(uuid.reversed())
        func structure(_ type: UInt8, _ data: [UInt8]) -> [UInt8] { [UInt8(data.count + 1), type] + data }
        let flags = structure(0x01, [0x06])
        func serviceData(_ value: [UInt8], uuid: [UInt8] = uuidLE) -> [UInt8] { structure(0x21, uuid + value) }
        func manufacturerData(_ value: [UInt8]) -> [UInt8] { structure(0xFF, [0xF5, 0x1C] + value) }
        let ours = flags + serviceData([0x00] + address)
        func claim(_ form: String, generation: UInt8, address: String?) -> FrameFields {
            var fields = ["form": form, "claim": address == nil ? "ios-device" : "bluetooth-address", "generation": "\(generation)"]
            fields["address"] = address
            return fields
        }
        let layout = ["BLE-1.1", "BLE-1.2"]
        let accept = ["BLE-1.2"]
        let parsing = ["BLE-1.3"]
        let cases: [FrameVectorCase] = [
            .init(id: "A-ours", description: "this layout: Flags 06, Thali service data 00 and the address (28 octets)",
                  requirements: layout, bytes: ours, expect: .valid,
                  frames: [claim("service-data", generation: 0, address: addressText)]),
            .init(id: "A-ios-device", description: "this layout for an iOS device: service data 01 (22 octets)",
                  requirements: layout, bytes: flags + serviceData([0x01]), expect: .valid,
                  frames: [claim("service-data", generation: 0, address: nil)]),
            .init(id: "A-other-flags", description: "Flags as another stack sets them (1a)", requirements: accept,
                  bytes: structure(0x01, [0x1A]) + serviceData([0x00] + address), expect: .valid,
                  frames: [claim("service-data", generation: 0, address: addressText)]),
            .init(id: "A-android-generation", description: "Android's service data: generation 7 in front of the address",
                  requirements: accept, bytes: flags + serviceData([0x07] + address), expect: .valid,
                  frames: [claim("service-data", generation: 7, address: addressText)]),
            .init(id: "A-android-manufacturer", description: "Android's manufacturer data of company 7413: 02 15, UUID, generation 5, address",
                  requirements: accept, bytes: manufacturerData([0x02, 0x15] + uuid + [0x05] + address), expect: .valid,
                  frames: [claim("manufacturer-data", generation: 5, address: addressText)]),
            .init(id: "A-zero-padding", description: "this layout followed by three zero octets (31 in all)",
                  requirements: parsing, bytes: ours + [0, 0, 0], expect: .valid,
                  frames: [claim("service-data", generation: 0, address: addressText)]),
            .init(id: "A-not-thali", description: "Flags and a 16-bit UUID list (feaa): well formed, not Thali, ignored",
                  requirements: accept, bytes: flags + structure(0x03, [0xAA, 0xFE]), expect: .valid, frames: []),
            .init(id: "A-other-uuid", description: "service data of another 128-bit UUID with an address-like value: ignored",
                  requirements: accept, bytes: flags + serviceData([0x00] + address, uuid: Array(1...16)), expect: .valid, frames: []),
            .init(id: "A-other-company", description: "manufacturer data of another company: ignored", requirements: accept,
                  bytes: structure(0xFF, [0x4C, 0x00, 0x02, 0x15] + uuid + [0x05] + address), expect: .valid, frames: []),
            .init(id: "A-too-long", description: "this layout and four zero octets: 32, over the 31-octet legacy payload",
                  requirements: parsing, bytes: ours + [0, 0, 0, 0], expect: .invalid, error: "too-long"),
            .init(id: "A-truncated-structure", description: "the service data's length reaches past the end",
                  requirements: parsing, bytes: Array(ours.dropLast(4)), expect: .invalid, error: "truncated-structure"),
            .init(id: "A-nonzero-padding", description: "a zero length octet, then a non-zero octet",
                  requirements: parsing, bytes: flags + [0x00, 0x01], expect: .invalid, error: "non-zero-padding"),
            .init(id: "A-flags-two-octets", description: "Flags holding two octets", requirements: parsing,
                  bytes: structure(0x01, [0x06, 0x00]) + serviceData([0x00] + address), expect: .invalid, error: "bad-flags-length"),
            .init(id: "A-flags-twice", description: "Flags twice, then this layout's service data (31 octets)",
                  requirements: parsing, bytes: flags + flags + serviceData([0x00] + address), expect: .invalid,
                  error: "duplicate-structure"),
            .init(id: "A-uuid-list-length", description: "a 128-bit UUID list of 4 octets", requirements: parsing,
                  bytes: flags + structure(0x06, [1, 2, 3, 4]), expect: .invalid, error: "bad-uuid-list-length"),
            .init(id: "A-service-data-length", description: "Thali service data of 3 octets (neither 1 nor 7)",
                  requirements: accept, bytes: flags + serviceData([0x00, 0xA0, 0xB1]), expect: .invalid,
                  error: "bad-service-data-length"),
            .init(id: "A-one-octet-not-01", description: "Thali service data of 1 octet that is not 01",
                  requirements: accept, bytes: flags + serviceData([0x02]), expect: .invalid, error: "unknown-service-data-flag"),
            .init(id: "A-manufacturer-prefix", description: "company 7413's data with prefix 03 15", requirements: accept,
                  bytes: manufacturerData([0x03, 0x15] + uuid + [0x05] + address), expect: .invalid, error: "bad-manufacturer-data"),
            .init(id: "A-manufacturer-length", description: "company 7413's data one octet short", requirements: accept,
                  bytes: manufacturerData([0x02, 0x15] + uuid + [0x05] + address.dropLast()), expect: .invalid,
                  error: "bad-manufacturer-data"),
            .init(id: "A-manufacturer-uuid", description: "company 7413's data with another UUID", requirements: accept,
                  bytes: manufacturerData([0x02, 0x15] + Array(1...16) + [0x05] + address), expect: .invalid,
                  error: "bad-manufacturer-data"),
        ]
        return FrameVectorSet(layer: .advertisingData,
                              source: "Laid out by hand from spec/ble-binding.md section 1 (AdvertisingDataVectors.swift), not by an encoder.", limits: ["max_payload_bytes": 31], cases: cases)
    }
}
