import Foundation
import PackagePlugin

/// Bakes the commit a target is built from into it: before every build, a generated `BuildCommit.swift`
/// declares `BuildCommit.hash`, the checkout's abbreviated commit (`git rev-parse --short HEAD`, with
/// `-dirty` when tracked files differ from it), or `nil` outside a git checkout (a source archive) or
/// without git. The file is rewritten only when its text changes, so a build at the same commit
/// recompiles nothing. SwiftPM has no build-time defines from git; this is the whole mechanism.
@main
struct BuildCommitPlugin: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) throws -> [Command] {
        let outputDirectory = context.pluginWorkDirectoryURL.appending(path: "Generated")
        let output = outputDirectory.appending(path: "BuildCommit.swift")
        return [
            .prebuildCommand(
                displayName: "Reading the commit of \(context.package.directoryURL.lastPathComponent)",
                executable: URL(fileURLWithPath: "/bin/sh"),
                arguments: ["-c", Self.script, "build-commit", context.package.directoryURL.path, output.path],
                outputFilesDirectory: outputDirectory)
        ]
    }

    /// `$1`: the package directory, `$2`: the file to write.
    static let script = #"""
        set -eu
        commit=$(git -C "$1" rev-parse --short HEAD 2>/dev/null) || commit=
        if [ -n "$commit" ] && [ -n "$(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
            commit="$commit-dirty"
        fi
        if [ -n "$commit" ]; then value="\"$commit\""; else value=nil; fi
        mkdir -p "$(dirname "$2")"
        text="// Generated before each build by Plugins/BuildCommit; not in the repository.
        enum BuildCommit {
            /// The abbreviated commit this binary was built from (\`-dirty\`: with uncommitted changes), or nil.
            static let hash: String? = $value
        }"
        if [ ! -f "$2" ] || [ "$(cat "$2")" != "$text" ]; then
            printf '%s\n' "$text" > "$2.tmp" && mv "$2.tmp" "$2"
        fi
        """#
}
