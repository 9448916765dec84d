/// The keys of `keys` that are not snake_case (lower case letters, digits, `_`), sorted: thali-node's
/// JSON output version 2 has no others.
public func notSnakeCase(_ keys: some Sequence<String>) -> [String] {
    keys.filter { key in !key.allSatisfy { $0.isLowercase || $0.isNumber || $0 == "_" } }.sorted()
}
