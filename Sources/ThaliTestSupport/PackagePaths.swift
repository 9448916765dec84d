/// Locates files of this package from a test's `#filePath`, so tests read `spec/vectors` and
/// `Tests/*/Reference` in place instead of bundling copies.
public enum PackagePaths {
    /// The package root, found from a test file's path (`<root>/Tests/<Target>/<File>.swift`).
    public static func root(from filePath: String = #filePath) -> String {
        var components = filePath.split(separator: "/", omittingEmptySubsequences: false)
        while let last = components.last, last != "Tests" { components.removeLast() }
        components.removeLast()
        return components.joined(separator: "/")
    }
}
