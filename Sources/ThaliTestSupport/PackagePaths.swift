import Foundation

/// Locates files of this package from a test's `#filePath`, so tests read `spec/vectors` and
/// `Tests/*/Reference` in place instead of bundling copies.
public enum PackagePaths {
    /// The package root, found from the path of one of its files: a test's (`<root>/Tests/<Target>/<File>.swift`)
    /// or this module's own (`<root>/Sources/ThaliTestSupport/...`, for the helpers here); else the
    /// current directory.
    public static func root(from filePath: String = #filePath) -> String {
        var components = filePath.split(separator: "/", omittingEmptySubsequences: false)
        while let last = components.popLast() {
            if last == "Tests" || last == "Sources" { return components.joined(separator: "/") }
        }
        return FileManager.default.currentDirectoryPath
    }
}

extension PackagePaths {
    /// The `thali-node` executable built beside the test bundle (`swift build --build-tests` builds
    /// both), else the one in `.build/debug`; nil if neither exists. `filePath` is a test file's path.
    public static func thaliNode(from filePath: String = #filePath) -> String? {
        builtExecutable("thali-node", from: filePath)
    }

    /// The executable product `name` of this package (`thali-node`, an example), built beside the test
    /// bundle, else in `.build/debug`; nil if neither exists. `filePath` is a test file's path.
    public static func builtExecutable(_ name: String, from filePath: String = #filePath) -> String? {
        let beside = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
            .appendingPathComponent(name).path
        return [beside, root(from: filePath) + "/.build/debug/" + name]
            .first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}
