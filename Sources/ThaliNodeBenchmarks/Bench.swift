import ArgumentParser

/// `thali-node bench`: benchmarks that print figures (release builds only give meaningful numbers). They
/// live apart from the CLI's commands, as swift-nio-http2 keeps its performance tester apart, and reach
/// the suite through its public API only, except for spawning `thali-node run` peers.
public struct Bench: AsyncParsableCommand {
    /// The `bench` command and its subcommands, one per layer or scenario.
    public static let configuration = CommandConfiguration(
        abstract: "Measure the speed of the suite's layers.",
        subcommands: [BenchBeacons.self, BenchSSDP.self, BenchMux.self, BenchTLS.self, BenchBLE.self, BenchDelivery.self, BenchCrowd.self, BenchHall.self, BenchFlood.self, BenchRelay.self, BenchSend.self, BenchLinks.self, BenchNetLab.self]
    )

    /// `bench` without a subcommand: prints its help.
    public init() {}
}
