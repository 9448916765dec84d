import Foundation
import Testing
import ThaliSupport
import ThaliTestSupport

/// The one-pass base64 encoder against Foundation's, in both alphabets and across split inputs.
@Suite struct Base64Tests {
    @Test func base64MatchesFoundationForEveryLengthAndSplit() {
        var random = SplitMix64(state: 0x6236_3421)
        for length in 0...100 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) }
            let expected = Data(bytes).base64EncodedString()
            let urlSafe = expected.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
            for split in Set([0, length / 3, length / 2, length]) {
                #expect(Base64.encode(bytes[..<split], bytes[split...]) == expected, "length \(length) split \(split)")
                #expect(Base64.encode(bytes[..<split], bytes[split...], urlSafe: true) == urlSafe)
            }
        }
    }
}
