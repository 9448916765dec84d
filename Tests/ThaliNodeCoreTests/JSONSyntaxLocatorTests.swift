import Foundation
import Testing
@testable import ThaliNodeCore

/// The configuration's syntax errors, placed by line and column with the real mistake, whatever
/// Foundation's decoder says (it calls several of these "end of file").
@Suite struct JSONSyntaxLocatorTests {
    typealias Problem = JSONSyntaxLocator.Problem

    static let broken: [(text: String, line: Int, column: Int, problem: Problem)] = [
        ("{\"a\": tru}", 1, 10, .unexpectedCharacter("}")),
        ("{\n  \"ssdpPort\": 1900,\n  \"logLevel\": info\n}\n", 3, 15, .unexpectedCharacter("i")),
        ("{ \"ssdpPort\": ", 1, 15, .unexpectedEnd),
        ("{\"a\" 1}", 1, 6, .unexpectedCharacter("1")),
        ("[1, 2", 1, 6, .unexpectedEnd),
        ("[1 2]", 1, 4, .unexpectedCharacter("2")),
        ("{\"a\": 01}", 1, 8, .invalidNumber),
        ("{\"a\": 1.}", 1, 9, .invalidNumber),
        ("{\"a\": -}", 1, 8, .invalidNumber),
        ("{\"a\": 1e}", 1, 9, .invalidNumber),
        ("{\"a\": \"x\\q\"}", 1, 10, .invalidEscape),
        ("{\"a\": \"\\u12g4\"}", 1, 12, .invalidEscape),
        ("{\"a\": \"tab\there\"}", 1, 11, .controlCharacterInString),
        ("{\"a\": \"x", 1, 9, .unexpectedEnd),
        ("{\"a\": 1} x", 1, 10, .trailingContent),
        ("{\"é\": nul}", 1, 10, .unexpectedCharacter("}")),
        ("", 1, 1, .unexpectedEnd),
        ("{a: 1}", 1, 2, .unexpectedCharacter("a")),
        ("{\"a\": truex}", 1, 11, .unexpectedCharacter("x")),
    ]

    @Test("each broken text is placed where it breaks, with what breaks it", arguments: 0..<broken.count)
    func brokenTextIsPlaced(_ index: Int) throws {
        let (text, line, column, problem) = Self.broken[index]
        let error = try #require(JSONSyntaxLocator.firstError(in: Array(text.utf8)), "\(text.debugDescription)")
        #expect(error.line == line && error.column == column && error.problem == problem, "\(text.debugDescription): \(error)")
        // Every one of them is broken for Foundation too.
        #expect(throws: (any Error).self) { try JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed]) }
    }

    @Test func wellFormedTextsHaveNoError() {
        let texts = [
            "{}", "[]", " { \"a\" : [ 1 , -2.5e+3 , 0 , 0.0, 1E-2 , true , false , null , \"\\u00e9\\n\\\"\" ] } ",
            "\u{FEFF}{\"bom\": 1}", "{\"nested\": {\"deeper\": [[[]]]}}", "\"text\"", "42", "{\"é\": \"ü ✓ 😀\"}",
        ]
        for text in texts {
            #expect(JSONSyntaxLocator.firstError(in: Array(text.utf8)) == nil, "\(text.debugDescription)")
        }
    }

    @Test func bytesThatAreNotUTF8AreNamed() throws {
        let bytes: [UInt8] = Array("{\"a\": \"".utf8) + [0xC3, 0x28] + Array("\"}".utf8)
        let error = try #require(JSONSyntaxLocator.firstError(in: bytes))
        #expect(error.problem == .invalidUTF8 && error.offset == 7)
    }

    @Test func nestingIsBounded() throws {
        let depth = JSONSyntaxLocator.maxDepth
        let deepest = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
        #expect(JSONSyntaxLocator.firstError(in: Array(deepest.utf8)) == nil)
        let tooDeep = String(repeating: "[", count: depth + 1) + String(repeating: "]", count: depth + 1)
        let error = try #require(JSONSyntaxLocator.firstError(in: Array(tooDeep.utf8)))
        #expect(error.problem == .tooDeep(limit: depth) && error.offset == depth)
        // Far deeper text costs no deeper recursion.
        let huge = Array(repeating: UInt8(ascii: "["), count: 1_000_000)
        #expect(JSONSyntaxLocator.firstError(in: huge)?.problem == .tooDeep(limit: depth))
    }

    @Test func columnsCountCharactersNotBytes() throws {
        let error = try #require(JSONSyntaxLocator.firstError(in: Array("{\"ü✓\": x}".utf8)))
        #expect(error.column == 8 && error.offset == 10)
    }

    /// Foundation's decoder takes a trailing comma (so the configuration loads and the locator is not
    /// asked); the locator, asked, holds to the grammar.
    @Test func aTrailingCommaIsOutsideTheGrammar() throws {
        let error = try #require(JSONSyntaxLocator.firstError(in: Array("{\"a\": 1,}".utf8)))
        #expect(error.column == 9 && error.problem == .unexpectedCharacter("}"))
    }

    /// Through the configuration's parser: Foundation calls this "end of file"; the error names the place.
    @Test func theConfigurationsErrorNamesThePlace() throws {
        do {
            _ = try NodeConfiguration.parse(Data("{\"logLevel\": tru}".utf8), path: "config.json")
            Issue.record("a broken configuration parsed")
        } catch let error as ConfigurationError {
            #expect("\(error)".contains("line 1, column 17: unexpected '}'"), "\(error)")
        }
    }
}
