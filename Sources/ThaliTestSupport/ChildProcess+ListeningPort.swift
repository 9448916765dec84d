import Foundation
@_exported import ThaliProcess

extension ChildProcess {
    /// The process listens on no IPv4 TCP port within the wait.
    public struct NotListening: Error, CustomStringConvertible {
        /// What the process printed so far.
        public let description: String
    }

    /// The IPv4 TCP port this process listens on (on any address), read from the kernel's socket table
    /// (`ss`), for servers that bind an ephemeral port without printing it (`gnutls-serv -p 0`).
    /// - Throws: ``NotListening`` when it listens on none within `wait`.
    public func listeningIPv4Port(within wait: Duration = .seconds(10)) async throws -> Int {
        let port = try await waitForValue(timeout: wait, every: .milliseconds(50)) { () async throws -> Int? in
            let ss = try ChildProcess("ss", ["-ltnpH"])
            _ = try await ss.waitForExit()
            for line in ss.output.split(separator: "\n") where line.contains("pid=\(pid),") {
                let fields = line.split(separator: " ", omittingEmptySubsequences: true)
                if fields.count > 3, fields[3].hasPrefix("0.0.0.0:"), let port = Int(fields[3].dropFirst(8)) { return port }
            }
            return nil
        }
        guard let port else { throw NotListening(description: "no listening IPv4 port within \(wait): \(output)") }
        return port
    }
}
