//! [`DatabaseClock`]: the ledger clock of a PostgreSQL store (see the module docs of [`super`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::pool::Shared;
use crate::bindings::types::Timestamp;
use crate::io::Clock;
use crate::storage::StorageError;

struct ClockState {
    /// When the last database reading was taken (the middle of its round trip).
    read_at: Instant,
    /// What it said.
    read_ms: u64,
    /// Half its round trip, rounded up: how far off the reading may be.
    uncertainty_ms: u64,
    /// When to read the database again.
    next_read: Instant,
    /// The latest time handed out.
    last: u64,
}

/// The ledger clock of a [`PostgresStorage`](super::PostgresStorage): the database server's clock,
/// re-read every [`clock_resample`](super::PostgresOptions::clock_resample), carried forward on this
/// host's monotonic clock in between, and never running backwards.
pub struct DatabaseClock {
    shared: Arc<Shared>,
    state: Mutex<ClockState>,
}

impl std::fmt::Debug for DatabaseClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseClock")
            .field("schema", &self.shared.schema)
            .finish_non_exhaustive()
    }
}

impl DatabaseClock {
    pub(super) fn new(shared: Arc<Shared>) -> Result<Self, StorageError> {
        let (read_at, read_ms, uncertainty_ms) = Self::read(&shared)?;
        let next_read = read_at + shared.options.clock_resample;
        Ok(DatabaseClock {
            shared,
            state: Mutex::new(ClockState {
                read_at,
                read_ms,
                uncertainty_ms,
                next_read,
                last: read_ms,
            }),
        })
    }

    /// One reading, stamped with the middle of its round trip, and half that
    /// round trip (the most the stamp can be off).
    fn read(shared: &Shared) -> Result<(Instant, u64, u64), StorageError> {
        let sent = Instant::now();
        let ms = shared.database_now()?;
        let answered = Instant::now();
        let half = (answered - sent) / 2;
        let uncertainty_ms = u64::try_from(half.as_micros().div_ceil(1000)).unwrap_or(u64::MAX);
        Ok((sent + half, ms, uncertainty_ms))
    }

    /// How far the last reading may be off the database's clock: half its
    /// round trip, in ms (rounded up). A loaded host or network stretches it.
    pub fn uncertainty_ms(&self) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).uncertainty_ms
    }
}

impl Clock for DatabaseClock {
    fn now(&self) -> Timestamp {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if Instant::now() >= state.next_read {
            // Unreachable database: carry the last reading forward (and do not
            // wait on it again until the next resample); every write fails until
            // it is back, so no decision rests on the estimate alone.
            if let Ok(reading) = Self::read(&self.shared) {
                (state.read_at, state.read_ms, state.uncertainty_ms) = reading;
            }
            state.next_read = Instant::now() + self.shared.options.clock_resample;
        }
        let carried = u64::try_from(state.read_at.elapsed().as_millis()).unwrap_or(u64::MAX);
        let estimate = state.read_ms.saturating_add(carried);
        state.last = state.last.max(estimate);
        state.last
    }
}
