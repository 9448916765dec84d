/// The version of `thali-node`: the one place it is set. `scripts/package.sh` reads it back from the built
/// binary (`--version`) for the Debian package, so nothing else repeats it.
enum Version {
    /// The semantic version (semver.org): MAJOR.MINOR.PATCH, raised by hand in the commit that makes a
    /// release. Below 1.0.0 a minor version may change the command line; the wire formats have their own
    /// versions in `spec/`, the `--json` output its own (``ThaliNode/jsonOutputVersion``).
    static let semantic = "0.1.0"

    /// What `thali-node --version` prints: `thali-node 0.1.0 (commit abcdef1)`, the commit only when
    /// built from a git checkout (``BuildCommit/hash``, baked in by the BuildCommit plugin), then on a
    /// second line the version of the `--json` output's schema.
    static var text: String {
        let commit = BuildCommit.hash.map { " (commit \($0))" } ?? ""
        return "thali-node \(semantic)\(commit)\nJSON output version \(ThaliNode.jsonOutputVersion)"
    }
}
