import Testing
import ThaliSupport

/// The suite's one hex codec: round trips, both cases, and the diagnoses a person sees for bad input.
@Suite struct HexTests {
    @Test func encodesLowerOrUpperCaseAndDecodesEitherCase() throws {
        let bytes: [UInt8] = [0x00, 0x01, 0x7f, 0x80, 0xab, 0xff]
        #expect(Hex.encode(bytes) == "00017f80abff")
        #expect(Hex.encode(bytes, uppercase: true) == "00017F80ABFF")
        #expect(try Hex.decoding("00017F80abFF") == bytes)
        #expect(Hex.decode("00017f80abff") == bytes)
        #expect(try Hex.decoding("") == [])
    }

    @Test func saysWhichCharacterIsNotADigitCountingCharactersNotBytes() {
        #expect(throws: Hex.DecodingError.notADigit("g", position: 3)) { try Hex.decoding("abgd") }
        // "é" is two UTF-8 bytes; the position is the one a person counts.
        #expect(throws: Hex.DecodingError.notADigit("é", position: 2)) { try Hex.decoding("aé0g") }
        // A full-width digit is a hex digit to `Character.isHexDigit`, but not to the decoder.
        #expect(throws: Hex.DecodingError.notADigit("１", position: 1)) { try Hex.decoding("１0") }
        #expect(Hex.decode("0x00") == nil)
        #expect(Hex.DecodingError.notADigit("g", position: 3).description == "'g' at position 3 is not a hex digit")
    }

    @Test func anOddCountIsNamed() {
        #expect(throws: Hex.DecodingError.oddDigitCount(5)) { try Hex.decoding("abcde") }
        #expect(Hex.DecodingError.oddDigitCount(5).description == "5 digits, an odd number")
        #expect(Hex.decode("abc") == nil)
    }
}
