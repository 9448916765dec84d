import Foundation
import Testing
import ThaliTestSupport

/// The app-facing API of ThaliNodeCore takes and returns Swift and Foundation types: no public
/// declaration names a NIO type, so an app needs no NIO module (the NIO-level parts are `package`).
@Suite struct PublicAPITests {
    static let nioTypes = #"\b(EventLoop\w*|Channel|ChannelHandlerContext|NIOAny|ByteBuffer|TimeAmount|NIOThreadPool|NIOAsyncChannel\w*)\b"#

    @Test("no public declaration of ThaliNodeCore names a NIO type")
    func publicDeclarationsNameNoNIOType() throws {
        let root = PackagePaths.root() + "/Sources/ThaliNodeCore"
        let pattern = try Regex(Self.nioTypes)
        let files = try FileManager.default.subpathsOfDirectory(atPath: root).filter { $0.hasSuffix(".swift") }
        #expect(files.count > 40)
        var offenders: [String] = []
        var publicLines = 0
        for file in files {
            let lines = try String(contentsOfFile: root + "/" + file, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
            for (number, line) in lines.enumerated() {
                let code = line.trimmingCharacters(in: .whitespaces)
                guard code.hasPrefix("public ") || code.hasPrefix("open ") else { continue }
                publicLines += 1
                if code.contains(pattern) { offenders.append("\(file):\(number + 1): \(code)") }
            }
        }
        #expect(publicLines > 200, "the scan reads the module's public declarations")
        #expect(offenders.isEmpty, "\(offenders.joined(separator: "\n"))")
    }
}
