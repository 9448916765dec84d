import ArgumentParser
import Foundation
import ThaliNodeCore

/// `thali-node config show|init`: the configuration file of the data directory.
struct Config: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show or create the configuration file (config.json in the data directory).",
        subcommands: [Show.self, Init.self], defaultSubcommand: Show.self
    )

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the effective configuration as JSON.")
        @OptionGroup var options: NodeOptions
        @Flag(help: "Accepted for symmetry with the other commands: the output is always JSON.") var json = false

        func run() throws {
            let configuration = try NodeConfiguration.load(home: try options.checkedHome(writing: false))
            let data = try JSONSerialization.data(withJSONObject: configuration.jsonObject, options: [.prettyPrinted, .sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        }
    }

    struct Init: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Write config.json with every key at its default.")
        @OptionGroup var options: NodeOptions
        @Flag(help: "Replace an existing file.") var force = false
        @Flag(help: "Print JSON for scripts.") var json = false

        func run() throws {
            let home = try options.checkedHome(writing: true)
            try home.create()
            if FileManager.default.fileExists(atPath: home.configurationPath) && !force {
                throw CommandFailure(exitCode: .exists, message: "\(home.configurationPath) exists; use --force to replace it")
            }
            let data = try JSONSerialization.data(withJSONObject: NodeConfiguration().jsonObject,
                                                  options: [.prettyPrinted, .sortedKeys])
            do {
                // A text file ends with a newline (editors and `cat` expect one).
                try (data + Data("\n".utf8)).write(to: URL(fileURLWithPath: home.configurationPath))
            } catch {
                throw NodeError.dataDirectoryUnusable(path: home.configurationPath, reason: SystemErrorText.describe(error))
            }
            if json { return try printJSON(["configuration_file": home.configurationPath]) }
            print("wrote \(home.configurationPath)")
        }
    }
}
