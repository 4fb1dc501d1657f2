//! Typed access to the ledger: records, tombstones and quota buckets as rows,
//! and transitions as atomic batches.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cell::RefCell;
use serde::{Deserialize, Serialize};

use crate::host::CommitError;
use crate::host::Host;
use crate::policy::{Policy, Quota};
use crate::record::{Event, OpRecord, Reservation};
use crate::types::{AuditEvent, Batch, KeySource, Put, Row, State, Table};

/// A record as read, with the version a write must compare against.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The record.
    pub rec: OpRecord,
    /// Its row version.
    pub version: u64,
}

/// Why the ledger could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerError {
    /// Another writer got there first: read again and decide again.
    Conflict,
    /// The store failed (or a row is unreadable).
    Storage(String),
    /// The decision needs a provider read that is the host's next step
    /// ([`crate::reads`]): it stopped before writing anything on its strength.
    ReadDeferred,
}

impl From<CommitError> for LedgerError {
    fn from(e: CommitError) -> Self {
        match e {
            CommitError::Conflict => LedgerError::Conflict,
            CommitError::Storage(s) => LedgerError::Storage(s),
        }
    }
}

impl LedgerError {
    /// A one-line description.
    pub fn message(&self) -> String {
        match self {
            LedgerError::Conflict => "the record kept changing under concurrent writers".to_string(),
            LedgerError::Storage(s) => s.clone(),
            LedgerError::ReadDeferred => "the decision waits for a provider read (a `read` step)".to_string(),
        }
    }
}

/// Read a record.
pub fn load(h: &impl Host, scope: &str, key: &str) -> Result<Option<Loaded>, LedgerError> {
    let Some(loaded) = load_as_stored(h, scope, key)? else {
        return Ok(None);
    };
    // A record that answers "no effect" or may be sent again is first checked against the
    // witness: a ledger restored from an older backup may have lost what happened since.
    if matches!(loaded.rec.state, State::Failed | State::Absent) {
        return crate::engine::catch_up(h, loaded);
    }
    Ok(Some(loaded))
}

/// The operation record as the ledger holds it, unchecked against the witness.
pub fn load_as_stored(h: &impl Host, scope: &str, key: &str) -> Result<Option<Loaded>, LedgerError> {
    let Some(row) = h.get(Table::Operation, scope, key).map_err(LedgerError::Storage)? else {
        return Ok(None);
    };
    if let Some(rec) = h.record_cache().and_then(|cache| cache.take(&row.body)) {
        return Ok(Some(Loaded {
            rec,
            version: row.version,
        }));
    }
    Ok(Some(decode_body(scope, key, row.version, &row.body)?))
}

/// The last operation record this engine committed, with the exact row body
/// it wrote. A row read back with a byte-identical body is that record, so
/// it is taken from here instead of being parsed again (a call's `report`
/// reads back what its `start` wrote: BENCHMARKS.md row 2). Any other body,
/// whatever its key or version, is parsed: the cache can only ever hand out
/// what parsing the same bytes would give.
#[derive(Debug, Default)]
pub struct RecordCache(RefCell<Option<(String, OpRecord)>>);

impl RecordCache {
    /// An empty cache.
    pub const fn new() -> Self {
        RecordCache(RefCell::new(None))
    }

    /// The record whose body is exactly `body`, if it is the one kept; it is
    /// handed out once (the caller changes it), so the cache is empty after.
    pub fn take(&self, body: &str) -> Option<OpRecord> {
        let mut slot = self.0.borrow_mut();
        match slot.as_ref() {
            Some((kept, _)) if kept == body => slot.take().map(|(_, rec)| rec),
            _ => None,
        }
    }

    /// Keep `rec`, committed with row body `body`.
    fn keep(&self, body: String, rec: OpRecord) {
        *self.0.borrow_mut() = Some((body, rec));
    }
}

/// Decode an operation row.
pub fn decode(row: &Row) -> Result<Loaded, LedgerError> {
    decode_body(&row.scope, &row.key, row.version, &row.body)
}

/// Decode an operation record's body, read at `version`.
fn decode_body(scope: &str, key: &str, version: u64, body: &str) -> Result<Loaded, LedgerError> {
    let rec: OpRecord = serde_json::from_str(body)
        .map_err(|e| LedgerError::Storage(format!("record {scope:?}/{key:?} is unreadable: {e}")))?;
    Ok(Loaded { rec, version })
}

/// A tombstone: what is left of a pruned record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Tool.
    pub tool: String,
    /// Fingerprint.
    pub fingerprint: String,
    /// Final state.
    pub outcome: State,
    /// When it was pruned.
    pub pruned_at: u64,
    /// Whether the operation's effect happened: a confirmed record, or a
    /// superseded one that stored a late receipt. Tombstones written before
    /// this was kept read it from `outcome` ([`Tombstone::effect_happened`]).
    #[serde(default, skip_serializing_if = "crate::record::is_false")]
    pub happened: bool,
    /// Whether an earlier attempt may have committed unseen when it was
    /// pruned ([`OpRecord::late_effect_possible`]): its effect is unknown.
    #[serde(default, skip_serializing_if = "crate::record::is_false")]
    pub uncertain: bool,
}

impl Tombstone {
    /// Whether the pruned operation's effect happened.
    pub fn effect_happened(&self) -> bool {
        self.happened || self.outcome == State::Confirmed
    }
}

/// Read a tombstone.
pub fn load_tombstone(h: &impl Host, scope: &str, key: &str) -> Result<Option<Tombstone>, LedgerError> {
    let Some(row) = h.get(Table::Tombstone, scope, key).map_err(LedgerError::Storage)? else {
        return Ok(None);
    };
    serde_json::from_str(&row.body)
        .map(Some)
        .map_err(|e| LedgerError::Storage(format!("tombstone {scope:?}/{key:?} is unreadable: {e}")))
}

/// The writes and audit events of one transition, committed together.
#[derive(Debug)]
pub struct Tx {
    batch: Batch,
    /// The last operation record staged, for the host's [`RecordCache`] once the batch applies.
    written: Option<OpRecord>,
}

impl Default for Tx {
    fn default() -> Self {
        Self::new()
    }
}

impl Tx {
    /// An empty transaction.
    pub fn new() -> Self {
        Tx {
            batch: Batch {
                puts: Vec::new(),
                events: Vec::new(),
                deferrable: false,
            },
            written: None,
        }
    }

    /// Mark the batch [`Batch::deferrable`]: it records only an attempt's own
    /// success or an observation, which a later read restores if it is lost.
    pub fn defer(&mut self) {
        self.batch.deferrable = true;
    }

    /// Update `rec` from version `expected` with the event of its transition.
    pub fn record(&mut self, rec: &mut OpRecord, expected: u64, event: Event, now: u64) {
        self.write(rec, Some(expected), expected + 1, event, now);
    }

    /// Insert a new record at `version` (1, or after an old key's audit trail).
    pub fn insert(&mut self, rec: &mut OpRecord, version: u64, event: Event, now: u64) {
        self.write(rec, None, version, event, now);
    }

    fn write(&mut self, rec: &mut OpRecord, expected: Option<u64>, version: u64, event: Event, now: u64) {
        rec.updated_at = now;
        let body = crate::body::record_json(rec);
        self.written = Some(rec.clone());
        self.batch.puts.push(Put {
            table: Table::Operation,
            scope: rec.scope.clone(),
            key: rec.key.clone(),
            expected,
            row: Some(Row {
                table: Table::Operation,
                scope: rec.scope.clone(),
                key: rec.key.clone(),
                version,
                state: Some(rec.state),
                due_at: rec.due_at(),
                owner: Some(rec.owner.clone()),
                body,
            }),
        });
        self.event(&rec.scope, &rec.key, version, event, Some(rec.state), now);
    }

    /// Delete a record (pruning) and leave its tombstone. A derived key leaves
    /// none: past its window the same arguments are a new operation, never expired.
    pub fn prune(&mut self, loaded: &Loaded, now: u64, skew: u64) {
        let rec = &loaded.rec;
        let tombstone = Tombstone {
            tool: rec.tool.clone(),
            fingerprint: rec.fingerprint.clone(),
            outcome: rec.state,
            pruned_at: now,
            happened: rec.receipt.is_some(),
            uncertain: rec.receipt.is_none() && rec.late_effect_possible(skew),
        };
        self.batch.puts.push(Put {
            table: Table::Operation,
            scope: rec.scope.clone(),
            key: rec.key.clone(),
            expected: Some(loaded.version),
            row: None,
        });
        if rec.key_source == KeySource::Application {
            self.batch.puts.push(Put {
                table: Table::Tombstone,
                scope: rec.scope.clone(),
                key: rec.key.clone(),
                expected: None,
                row: Some(Row {
                    table: Table::Tombstone,
                    scope: rec.scope.clone(),
                    key: rec.key.clone(),
                    version: 1,
                    state: None,
                    due_at: Some(now.saturating_add(rec.policy.tombstone_retention_ms)),
                    owner: None,
                    body: serde_json::to_string(&tombstone).expect("tombstones always serialize"),
                }),
            });
        }
        let event = Event {
            kind: "pruned",
            from: Some(rec.state),
            attempt: None,
            detail: "{}".to_string(),
        };
        self.event(&rec.scope, &rec.key, loaded.version + 1, event, None, now);
    }

    /// Fail the batch if the row exists; write nothing.
    pub fn assert_absent(&mut self, table: Table, scope: &str, key: &str) {
        self.batch.puts.push(Put {
            table,
            scope: scope.to_string(),
            key: key.to_string(),
            expected: None,
            row: None,
        });
    }

    /// Delete a row of another table with its version (tombstones, spent quota windows).
    pub fn delete(&mut self, row: &Row) {
        self.batch.puts.push(Put {
            table: row.table,
            scope: row.scope.clone(),
            key: row.key.clone(),
            expected: Some(row.version),
            row: None,
        });
    }

    fn event(&mut self, scope: &str, key: &str, version: u64, event: Event, to: Option<State>, now: u64) {
        self.batch.events.push(AuditEvent {
            scope: scope.to_string(),
            key: key.to_string(),
            version,
            at: now,
            kind: event.kind.to_string(),
            from_state: event.from,
            to_state: to,
            attempt: event.attempt,
            detail: event.detail,
        });
    }

    /// Commit everything atomically.
    pub fn commit(self, h: &impl Host) -> Result<(), LedgerError> {
        h.commit(&self.batch).map_err(LedgerError::from)?;
        if let (Some(cache), Some(rec)) = (h.record_cache(), self.written) {
            let body = self.batch.puts.into_iter().rev().find_map(|put| match put.row {
                Some(row) if row.table == Table::Operation && row.scope == rec.scope && row.key == rec.key => {
                    Some(row.body)
                }
                _ => None,
            });
            if let Some(body) = body {
                cache.keep(body, rec);
            }
        }
        Ok(())
    }

    /// Reserve `units` (in the policy's minor units) in the scope's quota
    /// bucket, in the same batch as the transition that spends them.
    ///
    /// A bucket has one unit, recorded with it: with `enforce_ceiling`, a
    /// policy that disagrees is refused, never summed. Without it (the money
    /// already moved) the amount is counted in the bucket's unit, rounded up.
    #[allow(clippy::too_many_arguments)]
    pub fn reserve(
        &mut self,
        h: &impl Host,
        scope: &str,
        tool: &str,
        quota: &Quota,
        units: u128,
        now: u64,
        enforce_ceiling: bool,
    ) -> Result<Reserved, LedgerError> {
        let bucket = Policy::bucket_of(quota, tool);
        let window_start = now - now % quota.window_ms;
        let current = self.bucket(h, scope, &bucket, window_start)?;
        let mut unit = Unit {
            decimals: quota.decimals,
            window_ms: quota.window_ms,
        };
        let mut units = units;
        if let Some(theirs) = current.as_ref().and_then(|b| b.unit)
            && theirs != unit
        {
            if enforce_ceiling {
                return Ok(Reserved::OtherUnit(format!(
                    "quota bucket {bucket:?} counts in {} decimal places over {} ms windows, but {tool}'s policy \
                     says {} over {} ms: a bucket has one unit, so this spend is refused, never summed",
                    theirs.decimals, theirs.window_ms, quota.decimals, quota.window_ms
                )));
            }
            units = rescale_up(units, quota.decimals, theirs.decimals)
                .ok_or_else(|| LedgerError::Storage("quota total overflows".to_string()))?;
            unit = theirs;
        }
        let used = current.as_ref().map_or(0, |b| b.used);
        let used = if crate::mutant::on(crate::mutant::Mutant::DoubleReservation) {
            used.saturating_add(units)
        } else {
            used
        };
        let total = used
            .checked_add(units)
            .ok_or_else(|| LedgerError::Storage("quota total overflows".to_string()))?;
        let ceiling = crate::amount::parse_minor_units(&quota.ceiling, quota.decimals).unwrap_or(0);
        if enforce_ceiling && total > ceiling {
            return Ok(Reserved::OverCeiling);
        }
        let expected = current.and_then(|b| b.expected);
        self.put_bucket(
            scope,
            bucket_key(&bucket, window_start),
            BucketState {
                used: total,
                expected,
                unit: Some(unit),
            },
            window_start.saturating_add(quota.window_ms),
        );
        Ok(Reserved::Yes(Reservation {
            bucket,
            window_start,
            window_ms: quota.window_ms,
            units: units.to_string(),
        }))
    }

    /// An effect happened after its reservation was released (a late success,
    /// an operator's confirmation): the money moved, so count it, ceiling or not.
    pub fn count_spend(&mut self, h: &impl Host, rec: &mut OpRecord, now: u64) -> Result<(), LedgerError> {
        if let (Some(quota), Some(spend), None) = (&rec.policy.quota, &rec.spend, &rec.reservation) {
            let units = spend.parse().unwrap_or(0);
            if let Reserved::Yes(reservation) = self.reserve(h, &rec.scope, &rec.tool, quota, units, now, false)? {
                rec.reservation = Some(reservation);
            }
        }
        Ok(())
    }

    /// Give a reservation back to its window (a window already pruned has nothing to give back to).
    pub fn release(&mut self, h: &impl Host, scope: &str, reservation: &Reservation) -> Result<(), LedgerError> {
        let units: u128 = reservation.units.parse().unwrap_or(0);
        if let Some(current) = self.bucket(h, scope, &reservation.bucket, reservation.window_start)? {
            let window_end = reservation.window_start.saturating_add(reservation.window_ms);
            let key = bucket_key(&reservation.bucket, reservation.window_start);
            let left = BucketState {
                used: current.used.saturating_sub(units),
                ..current
            };
            self.put_bucket(scope, key, left, window_end);
        }
        Ok(())
    }

    /// The bucket as this batch would leave it, or as stored.
    fn bucket(
        &self,
        h: &impl Host,
        scope: &str,
        bucket: &str,
        window_start: u64,
    ) -> Result<Option<BucketState>, LedgerError> {
        let key = bucket_key(bucket, window_start);
        if let Some(put) = self.pending_bucket(scope, &key) {
            let (used, unit) = match &put.row {
                Some(row) => contents(&row.key, &row.body)?,
                None => (0, None),
            };
            return Ok(Some(BucketState {
                used,
                expected: put.expected,
                unit,
            }));
        }
        match h.get(Table::Quota, scope, &key).map_err(LedgerError::Storage)? {
            None => Ok(None),
            Some(row) => {
                let (used, unit) = contents(&key, &row.body)?;
                Ok(Some(BucketState {
                    used,
                    expected: Some(row.version),
                    unit,
                }))
            }
        }
    }

    fn pending_bucket(&self, scope: &str, key: &str) -> Option<&Put> {
        self.batch
            .puts
            .iter()
            .find(|p| p.table == Table::Quota && p.scope == scope && p.key == key)
    }

    fn put_bucket(&mut self, scope: &str, key: String, state: BucketState, window_end: u64) {
        // One put per bucket per batch: a second touch replaces the first.
        self.batch
            .puts
            .retain(|p| !(p.table == Table::Quota && p.scope == scope && p.key == key));
        let expected = state.expected;
        let body = serde_json::to_string(&QuotaBucket {
            used: state.used.to_string(),
            decimals: state.unit.map(|u| u.decimals),
            window_ms: state.unit.map(|u| u.window_ms),
        })
        .expect("buckets always serialize");
        self.batch.puts.push(Put {
            table: Table::Quota,
            scope: scope.to_string(),
            key: key.clone(),
            expected,
            row: Some(Row {
                table: Table::Quota,
                scope: scope.to_string(),
                key,
                version: expected.map_or(1, |v| v + 1),
                state: None,
                due_at: Some(window_end),
                owner: None,
                body,
            }),
        });
    }
}

/// What a reservation came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// Reserved in this batch.
    Yes(Reservation),
    /// The total would pass the ceiling.
    OverCeiling,
    /// The bucket counts in another unit than this policy (why, for the caller).
    OtherUnit(String),
}

/// The unit a bucket counts in: minor-unit decimals and window length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unit {
    decimals: u8,
    window_ms: u64,
}

struct BucketState {
    used: u128,
    expected: Option<u64>,
    /// None for a bucket written before units were recorded: it takes the next writer's.
    unit: Option<Unit>,
}

/// `units` with `from` decimal places in `to` places, rounded up (never under-counts spend).
fn rescale_up(units: u128, from: u8, to: u8) -> Option<u128> {
    if to >= from {
        units.checked_mul(10u128.checked_pow(u32::from(to - from))?)
    } else {
        let div = 10u128.checked_pow(u32::from(from - to))?;
        Some(units.div_ceil(div))
    }
}

fn bucket_key(bucket: &str, window_start: u64) -> String {
    format!("{bucket}@{window_start}")
}

fn contents(key: &str, body: &str) -> Result<(u128, Option<Unit>), LedgerError> {
    let unreadable = || LedgerError::Storage(format!("quota bucket {key:?} is unreadable"));
    let bucket = serde_json::from_str::<QuotaBucket>(body).map_err(|_| unreadable())?;
    let used = bucket.used.parse().map_err(|_| unreadable())?;
    let unit = match (bucket.decimals, bucket.window_ms) {
        (Some(decimals), Some(window_ms)) => Some(Unit { decimals, window_ms }),
        _ => None,
    };
    Ok((used, unit))
}

#[derive(Serialize, Deserialize)]
struct QuotaBucket {
    used: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    decimals: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window_ms: Option<u64>,
}
