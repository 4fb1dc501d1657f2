//! The background worker: every `sweep_interval` one settle round — the
//! engine's sweep of this gateway's records, and every owed dispatch it
//! grants, sent with its original provider key and reported — and before
//! exit the wait for what this gateway answered as unsettled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use once::types::{Error, Repeat};
use once::{Called, Once, OnceError};
use tokio::task::JoinHandle;

use crate::handler::{Sender, Shared, called_name};
use crate::reply::Capture;

/// Owed dispatches one round sends at most.
const ROUND_LIMIT: u32 = 200;

/// Run [`settle_round`] every `sweep_interval`, until the task is aborted.
pub(crate) fn spawn(shared: Arc<Shared>, once: Arc<Once>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            settle_round(&shared, &once).await;
            tokio::time::sleep(shared.config.sweep_interval).await;
        }
    })
}

/// The client is gone; operations it left unsettled are still ours to finish:
/// wait (at most `shutdown_grace`) while the worker settles them.
pub(crate) async fn drain(shared: &Shared) {
    let grace = Instant::now() + shared.config.shutdown_grace;
    while shared.has_pending() && Instant::now() < grace {
        tokio::time::sleep(shared.config.sweep_interval).await;
    }
    if shared.has_pending() {
        tracing::warn!(target: "once::gateway", "exiting with unsettled operations; the next gateway or `once sweep` continues them");
    }
}

/// One round of background work: the engine's sweep with every owed dispatch it
/// grants sent; then each operation this gateway answered as unsettled, asked
/// once more (without waiting) until the engine says a repeat would no longer wait.
pub async fn settle_round(shared: &Shared, once: &Arc<Once>) {
    let mut capture = Capture::default();
    let mut sender = Sender {
        shared,
        once,
        capture: &mut capture,
    };
    match once.settle_async(ROUND_LIMIT, &mut sender).await {
        Ok(settled) => {
            for called in &settled.sent {
                tracing::info!(target: "once::gateway", outcome = called_name(called), "owed dispatch");
            }
        }
        Err(e) => tracing::warn!(target: "once::gateway", "sweep: {e}"),
    }
    for (scope, key) in shared.pending() {
        let mut capture = Capture::default();
        let mut sender = Sender {
            shared,
            once,
            capture: &mut capture,
        };
        let called = once.resume_async(&scope, &key, Duration::ZERO, &mut sender).await;
        match called {
            Ok(Called::Done(account)) if account.repeat != Repeat::Waits => shared.settled(scope, key),
            // No record under this key: the call was refused before anything was recorded (a
            // successor blocked while the key it supersedes is unresolved waits on that key, not
            // on its own), so there is nothing here for this gateway to settle.
            Err(OnceError::Engine(Error::NotFound)) => {
                tracing::info!(target: "once::gateway", scope, key, "no record under a key kept as unsettled: forgotten");
                shared.settled(scope, key)
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(target: "once::gateway", scope, key, "resume: {e}"),
        }
    }
}
