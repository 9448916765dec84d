import ArgumentParser
import Foundation
import NIOCore
import ThaliNodeCore
import ThaliSSDP

/// The exit codes of every `thali-node` command: the one table (spec/node.md, "Exit codes"), BSD's
/// `sysexits.h` values where one fits, so a script can tell a typo from a missing file from a busy node.
enum ExitStatus: Int32, CaseIterable {
    /// Done.
    case success = 0
    /// A failure at run time that the line names: a network, a peer, a failing conformance case or vector.
    case failure = 1
    /// `EX_USAGE`: the command line does not parse or validate (an unknown option, a value out of range,
    /// a key where a name belongs).
    case usage = 64
    /// `EX_DATAERR`: the command names what this node does not have or will not take (an unknown contact
    /// or item, a file over the size limit, a file name that cannot be delivered).
    case dataError = 65
    /// `EX_NOINPUT`: something to read is missing or unreadable (the file to send, the identity).
    case noInput = 66
    /// `EX_UNAVAILABLE`: what the command needs is not there (no `run` to follow, a port or address that
    /// cannot be had, no Bluetooth).
    case unavailable = 69
    /// `EX_CANTCREAT`: it exists already, or holds data, and replacing or removing it needs `--force`.
    case exists = 73
    /// `EX_IOERR`: the data directory cannot be written (disk full, read-only, not this user's), or
    /// standard output failed.
    case ioError = 74
    /// `EX_TEMPFAIL`: busy now, try again later (the data directory is held by another `run`, a session
    /// with that contact is running).
    case busy = 75
    /// `EX_CONFIG`: `config.json` cannot be used.
    case configuration = 78

    /// The exit status for `error` thrown by a command; nil for ArgumentParser's own errors (a parse
    /// error is `usage`, help and `--version` succeed) and its `ExitCode`, whose codes it keeps.
    static func of(_ error: any Error) -> ExitStatus? {
        switch error {
        case let failure as CommandFailure: return failure.exitCode
        case let error as NodeError: return of(error)
        case is ConfigurationError: return .configuration
        case is ValidationError, is CommandLineArguments.InvalidUTF8: return .usage
        case is PeerConfiguration.NodeResolutionError: return .usage
        case SSDPDiscoveryService.StartError.noInterface: return .unavailable
        case SSDPDiscoveryService.StartError.invalidAddress, is SocketAddressError: return .configuration
        default: return nil
        }
    }

    private static func of(_ error: NodeError) -> ExitStatus {
        switch error {
        case .missingIdentity, .unreadableFile: .noInput
        case .unusableIdentity, .unknownContact, .itemTooLarge, .invalidFileName, .unknownItem, .ambiguousItem: .dataError
        case .invalidContactName, .invalidPublicKey, .invalidExpiry: .usage
        case .identityExists, .contactExists, .contactKeyExists, .contactHasQueuedItems: .exists
        case .portInUse, .noUsableInterface, .addressNotLocal, .bluetoothUnavailable: .unavailable
        case .dataDirectoryUnusable, .storeUnavailable: .ioError
        case .sessionInProgress, .homeInUse: .busy
        case .fileChangedWhileRead: .dataError
        }
    }
}

/// A command's failure with its own exit status and one line for standard error.
struct CommandFailure: Error, CustomStringConvertible {
    /// The status the process exits with.
    let exitCode: ExitStatus
    /// What went wrong, in words.
    let message: String

    var description: String { message }
}
