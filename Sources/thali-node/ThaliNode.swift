import ArgumentParser

/// `thali-node`: the command-line Thali peer, its demo, benchmarks and conformance tools.
@main
struct ThaliNode: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "thali-node",
        abstract: "A Thali peer: private discovery of contacts and authenticated delivery over local networks.",
        subcommands: [Demo.self, Conformance.self, Bench.self, Discover.self, Identity.self, Contacts.self, Send.self, Outbox.self, Inbox.self, Config.self, Run.self]
    )
}

/// Conformance tools other implementers run against their own wire formats.
struct Conformance: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check wire formats against the conformance vectors, or probe another implementation's endpoint.",
        subcommands: [ConformanceBeacons.self, ConformanceProbeCommand.self]
    )
}

/// Benchmarks that print figures (release builds only give meaningful numbers).
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure the speed of the suite's layers.",
        subcommands: [BenchBeacons.self, BenchSSDP.self, BenchMux.self, BenchTLS.self, BenchBLE.self, BenchDelivery.self, BenchCrowd.self, BenchFlood.self]
    )
}
