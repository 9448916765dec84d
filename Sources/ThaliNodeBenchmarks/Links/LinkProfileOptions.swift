import ArgumentParser
import ThaliNetLab

/// The `--profile` of `bench links` and `bench netlab`, and overrides of its figures (for a table of how
/// the node scales with round trip and loss without a named profile per row).
struct LinkProfileOptions: ParsableArguments {
    @Option(help: "The link profile: \(LinkProfile.named.map(\.name).joined(separator: ", ")).") var profile = "home-wifi"
    @Option(help: "Override the profile's one-way delay, in ms.") var delayMs: Double?
    @Option(help: "Override the profile's jitter (± ms around the delay).") var jitterMs: Double?
    @Option(help: "Override the profile's loss, in percent.") var lossPercent: Double?
    @Option(help: "Override the profile's multicast loss, in percent.") var multicastLossPercent: Double?
    @Option(help: "Override the profile's rate, in Mbit/s (0: no rate limit).") var rateMbit: Double?

    func validate() throws {
        guard LinkProfile.named(profile) != nil else {
            throw ValidationError("unknown profile \(profile); one of \(LinkProfile.named.map(\.name).joined(separator: ", "))")
        }
        for (name, value) in [("--delay-ms", delayMs), ("--jitter-ms", jitterMs), ("--rate-mbit", rateMbit)] {
            if let value, !(0...10_000).contains(value) { throw ValidationError("\(name) must be in 0...10000") }
        }
        for (name, value) in [("--loss-percent", lossPercent), ("--multicast-loss-percent", multicastLossPercent)] {
            if let value, !(0...100).contains(value) { throw ValidationError("\(name) must be in 0...100") }
        }
    }

    /// The named profile with the overrides applied (its name gets a `+` when any is).
    func resolved() throws -> LinkProfile {
        guard var link = LinkProfile.named(profile) else { throw ValidationError("unknown profile \(profile)") }
        if let delayMs { link.delayNanoseconds = Int64(delayMs * 1e6) }
        if let jitterMs { link.jitterNanoseconds = Int64(jitterMs * 1e6) }
        if let lossPercent { link.loss = lossPercent / 100 }
        if let multicastLossPercent { link.multicastLoss = multicastLossPercent / 100 }
        if let rateMbit { link.rateBitsPerSecond = rateMbit == 0 ? nil : Int(rateMbit * 1e6) }
        if [delayMs, jitterMs, lossPercent, multicastLossPercent, rateMbit].contains(where: { $0 != nil }) { link.name += "+" }
        return link
    }
}
