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

    /// The configuration values an app sets through `PeerConfiguration` and `BluetoothPeerConfiguration`
    /// live in the protocol modules; their time limits are `Duration` too, so one time type is public.
    static let nestedConfigurations: [(file: String, type: String)] = [
        ("ThaliPSKTLS/PSKTLSConfiguration.swift", "PSKTLSConfiguration"),
        ("ThaliAdmission/AdmissionLimits.swift", "AdmissionLimits"),
        ("ThaliSSDP/Discovery/SSDPDiscoveryLimits.swift", "SSDPDiscoveryLimits"),
        ("ThaliSSDP/Discovery/SSDPDiscoveryConfiguration.swift", "SSDPDiscoveryConfiguration"),
        ("TCPMultiplexer/MultiplexerConfiguration.swift", "MultiplexerConfiguration"),
        ("ThaliBLEBinding/BluetoothBindingLimits.swift", "BluetoothBindingLimits"),
    ]

    @Test("the configurations nested in the peer's name no NIO type in their public declarations")
    func nestedConfigurationsNameNoNIOType() throws {
        let pattern = try Regex(Self.nioTypes.replacingOccurrences(of: "TimeAmount|", with: "TimeAmount|NIODeadline|"))
        for (file, type) in Self.nestedConfigurations {
            let lines = try String(contentsOfFile: PackagePaths.root() + "/Sources/" + file, encoding: .utf8)
                .split(separator: "\n", omittingEmptySubsequences: false)
            guard let start = lines.firstIndex(where: { $0.hasPrefix("public struct \(type)") }) else {
                Issue.record("\(file) declares no public struct \(type)")
                continue
            }
            // The struct's body: up to the line whose braces balance the declaration's.
            var depth = 0
            var publicLines: [String] = []
            for line in lines[start...] {
                depth += line.filter { $0 == "{" }.count - line.filter { $0 == "}" }.count
                let code = line.trimmingCharacters(in: .whitespaces)
                if code.hasPrefix("public ") { publicLines.append(code) }
                if depth == 0 { break }
            }
            #expect(publicLines.count > 2, "\(type): the scan reads its public declarations")
            let offenders = publicLines.filter { $0.contains(pattern) }
            #expect(offenders.isEmpty, "\(type): \(offenders.joined(separator: "\n"))")
        }
    }
}
