import Foundation
import GRDB
import ThaliSupport

// Items a receiver cannot hold now (delivery protocol version 4, refusal `noSpace`): they stay pending
// but wait for a retry time, persisted in `outboxItem.retryAtMs` (migration `v3-offer-deferral`), so a
// restarted node keeps waiting too. ``NodeStore/pendingItems(for:now:)`` and
// ``NodeStore/contactsWithPendingItems(now:)`` skip an item until its retry time; the peer's outbox poll
// asks ``NodeStore/nextRetryTime(now:)`` when to look again.

extension NodeStore {
    /// Defers pending item `id` after a temporary refusal: its refusals in a row grow by one, its retry
    /// time is `now` plus `backoff`'s delay before that retry, and its last problem becomes `problem(wait)`
    /// (words for the user). Returns the wait. An item no longer queued (or no longer pending) is left
    /// alone and the nominal first wait returned.
    @discardableResult
    func deferItem(_ id: UUID, backoff: Backoff, now: Date = Date(), problem: (Duration) -> String) throws -> Duration {
        try pool.write { db -> Duration in
            guard let refusals = try Int.fetchOne(db, sql: "SELECT deferrals FROM outboxItem WHERE id = ? AND state = ?",
                                                  arguments: [id, OutboxState.pending.rawValue]) else {
                return backoff.nominalDelay(beforeRetry: 1)
            }
            let wait = backoff.delay(beforeRetry: refusals + 1)
            let retryAt = now.milliseconds + Int64(wait.timeInterval * 1000)
            try db.execute(sql: "UPDATE outboxItem SET deferrals = ?, retryAtMs = ?, lastError = ? WHERE id = ?",
                           arguments: [refusals + 1, retryAt, problem(wait), id])
            return wait
        }
    }

    /// When item `id` may be offered again (nil: it is due now, or not queued), and how many temporary
    /// refusals in a row it had.
    public func retryTime(of id: UUID) throws -> (retryAt: Date?, refusals: Int) {
        try pool.read { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT retryAtMs, deferrals FROM outboxItem WHERE id = ?", arguments: [id]) else {
                return (nil, 0)
            }
            let retryAt: Int64? = row["retryAtMs"]
            return (retryAt.map(Date.init(milliseconds:)), row["deferrals"])
        }
    }

    /// The earliest retry time after `now` of a pending, unexpired item that waits (nil: none waits):
    /// when the outbox next has something due that it does not have now.
    public func nextRetryTime(now: Date = Date()) throws -> Date? {
        try pool.read { db in
            try Int64.fetchOne(db, sql: """
                SELECT MIN(retryAtMs) FROM outboxItem WHERE state = ? AND expiresAtMs > ? AND retryAtMs > ?
                """, arguments: [OutboxState.pending.rawValue, now.milliseconds, now.milliseconds])
        }.map(Date.init(milliseconds:))
    }
}
