import NIOCore
import NIOHTTP1
import ThaliBeacons
import ThaliSSDP

/// Load: a burst of fetches, the busy answers and the recovery after it.
extension ConformanceProbe {
    /// How the server treated one request of the burst.
    enum BurstResult: Sendable, Hashable {
        case answered
        case throttled(String)
        case timedOut
        case other(String)

        init(_ outcome: ProbeOutcome) {
            switch outcome {
            case .response(let response):
                switch response.head.status.code {
                case 200, 204: self = .answered
                case 429, 503: self = .throttled("status \(response.head.status.code)")
                case let code: self = .other("status \(code)")
                }
            case .connectFailed: self = .throttled("connection refused")
            case .closedWithoutResponse: self = .throttled("closed without answer")
            case .connectTimedOut, .timedOut: self = .timedOut
            case .tooLarge: self = .other("head too large")
            case .malformed: self = .other("malformed")
            }
        }
    }

    /// The `503` answers of a burst, judged one by one as they come (only the tally is kept).
    struct BusyTally: Sendable {
        /// `503` answers seen.
        var answers = 0
        /// The distinct `Retry-After` values of the well-formed ones, in seconds.
        var retryAfterSeconds: Set<Int> = []
        /// Answers that break the form [SSDP-6.9].
        var malformed = 0
        /// Why the first of them does.
        var firstProblem: String?

        /// Adds one answer: `problem` nil when it is well formed, naming `seconds`.
        mutating func add(seconds: Int?, problem: String?) {
            answers += 1
            if let problem {
                malformed += 1
                if firstProblem == nil { firstProblem = problem }
            } else if let seconds {
                retryAfterSeconds.insert(seconds)
            }
        }
    }

    /// Judges a `503`'s form [SSDP-6.9]: one `Retry-After` of whole seconds (delta-seconds, not an
    /// HTTP-date) from 1 to `maxRetryAfter`, and no body (a busy server serves no stream). Returns the
    /// seconds it names, or why it is malformed.
    static func judgeBusyAnswer(_ response: ProbeResponse, maxRetryAfter: Duration) -> Result<Int, BusyAnswerProblem> {
        let values = response.head.headers["Retry-After"]
        guard let value = values.first else { return .failure(.init("no Retry-After")) }
        guard values.count == 1 else { return .failure(.init("Retry-After \(values.count) times")) }
        let trimmed = value.trimmingSpaces
        let maximum = Int(maxRetryAfter.components.seconds)
        guard !trimmed.isEmpty, trimmed.count <= 10, trimmed.utf8.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }),
              let seconds = Int(trimmed)
        else { return .failure(.init("Retry-After \(quoted(value)) is not whole seconds")) }
        guard (1...maximum).contains(seconds) else { return .failure(.init("Retry-After \(seconds) s is outside 1 ... \(maximum) s")) }
        guard response.complete, response.body.isEmpty, !response.exceededBodyLimit else {
            return .failure(.init(response.complete ? "a body of \(response.body.count)\(response.exceededBodyLimit ? "+" : "") bytes"
                                                    : "the connection ended before the response did"))
        }
        return .success(seconds)
    }

    /// Why a `503` is malformed, in a few words.
    struct BusyAnswerProblem: Error, Sendable {
        var reason: String
        init(_ reason: String) { self.reason = reason }
    }

    /// Sends `burstRequests` GETs, `burstConcurrency` at a time, each on its own connection, within
    /// `burstTimeLimit`; results in completion order, and the tally of the `503` answers among them.
    func runBurst() async -> (results: [BurstResult], sent: Int, busy: BusyTally) {
        let deadline = NIODeadline.now() + TimeAmount(configuration.burstTimeLimit)
        let maxRetryAfter = configuration.maxBusyRetryAfter
        return await withTaskGroup(of: (BurstResult, Result<Int, BusyAnswerProblem>?).self) { group in
            var results: [BurstResult] = []
            var busy = BusyTally()
            func add(_ result: (BurstResult, Result<Int, BusyAnswerProblem>?)) {
                results.append(result.0)
                switch result.1 {
                case .success(let seconds): busy.add(seconds: seconds, problem: nil)
                case .failure(let problem): busy.add(seconds: nil, problem: problem.reason)
                case nil: break
                }
            }
            var sent = 0
            while sent < configuration.burstRequests, NIODeadline.now() < deadline {
                if sent - results.count >= configuration.burstConcurrency, let result = await group.next() {
                    add(result)
                    continue
                }
                sent += 1
                group.addTask {
                    let outcome = await self.oneShot(.GET, BeaconLocation.notificationBeaconsPath)
                    guard case .response(let response) = outcome, response.head.status == .serviceUnavailable else {
                        return (BurstResult(outcome), nil)
                    }
                    return (BurstResult(outcome), Self.judgeBusyAnswer(response, maxRetryAfter: maxRetryAfter))
                }
            }
            for await result in group { add(result) }
            return (results, sent, busy)
        }
    }

    /// Grades the form of the burst's `503` answers [SSDP-6.9]; N/A when none came, since a server shows
    /// its busy answer only with its admission budget nearly spent, which one source may not reach (its
    /// per-source limits refuse first).
    func checkBusyAnswers(_ busy: BusyTally, into report: inout ProbeReport) {
        guard busy.answers > 0 else {
            report.record("busy-answer", .notApplicable, "no 503 in the burst (refused otherwise, or never busy)")
            return
        }
        guard let problem = busy.firstProblem else {
            let values = busy.retryAfterSeconds.sorted().map(String.init).joined(separator: ", ")
            report.record("busy-answer", .pass, "\(busy.answers) answered 503, Retry-After (s): \(values), no body")
            return
        }
        // A SHOULD (SSDP-6.9): a malformed busy answer is a warning.
        report.record("busy-answer", .warn, "\(busy.malformed) of \(busy.answers) 503 answers malformed; the first: \(problem)")
    }

    func checkBurst(into report: inout ProbeReport) async {
        let (results, sent, busy) = await runBurst()
        let answered = results.count { $0 == .answered }
        let timedOut = results.count { $0 == .timedOut }
        let throttled = results.filter { if case .throttled = $0 { true } else { false } }
        let other = results.count - answered - timedOut - throttled.count
        var tally = "\(sent) sent, \(configuration.burstConcurrency) at a time: \(answered) answered, \(throttled.count) refused, \(timedOut) timed out"
        if other > 0 { tally += ", \(other) other" }
        if sent < configuration.burstRequests { tally += "; time limit reached" }
        if let firstThrottle = results.firstIndex(where: { if case .throttled = $0 { true } else { false } }),
            case .throttled(let how) = results[firstThrottle]
        {
            let before = results[..<firstThrottle].count { $0 == .answered }
            report.record("burst", .pass, "throttled after \(before) answered (first refusal: \(how)); \(tally)")
        } else if timedOut > 0 {
            report.record("burst", .warn, "no explicit refusal, but requests timed out (overwhelmed or silently dropping); \(tally)")
        } else {
            // Throttling is a policy (PROFILE, SSDP-7.1), not a wire rule: never throttling is a warning.
            report.record("burst", .warn, "never throttled; \(tally)")
        }
        checkBusyAnswers(busy, into: &report)
    }

    /// After the burst the server may close its port for a while (the seed allows it), but it must come
    /// back within `maxOutage`.
    func checkRecovery(into report: inout ProbeReport) async {
        let start = NIODeadline.now()
        let deadline = start + TimeAmount(configuration.maxOutage)
        var last: ProbeOutcome
        repeat {
            last = await oneShot(.GET, BeaconLocation.notificationBeaconsPath)
            if case .response(let response) = last, [.ok, .noContent].contains(response.head.status) {
                let waited = NIODeadline.now() - start
                report.record("recovery", .pass, waited < TimeAmount(configuration.recoveryPollInterval)
                              ? "answering right after the burst" : "answering again \(Self.text(waited)) after the burst")
                return
            }
            do {
                try await Task.sleep(for: configuration.recoveryPollInterval)
            } catch {
                break  // cancelled: report what was seen so far
            }
        } while NIODeadline.now() < deadline
        report.record("recovery", .warn,
                      "not answering \(Self.text(configuration.maxOutage)) after the burst (last: \(Self.text(last)))")
    }
}
