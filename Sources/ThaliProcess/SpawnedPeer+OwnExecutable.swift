import Foundation

extension SpawnedPeer {
    /// This executable's path from `/proc/self/exe`, else from a path in `argv[0]`: the demo's and the
    /// benchmarks' peers run the same binary.
    package static func ownExecutable() throws -> String {
        if let resolved = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { return resolved }
        let argument = CommandLine.arguments[0]
        if argument.contains("/") { return URL(fileURLWithPath: argument).standardizedFileURL.path }
        throw ExecutableNotFound()
    }

    /// Neither `/proc/self/exe` nor `argv[0]` names this executable.
    package struct ExecutableNotFound: Error, CustomStringConvertible {
        /// What went wrong, in words.
        package var description: String { "cannot find the thali-node executable to start the peers" }
    }
}
