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

/// Run [`settle_round`] every `sweep_interval`, until the task is aborted. Each round is a task of its
/// own: a round that panics is logged and the next one comes, and aborting the loop never cuts a round
/// short (it ends with the runtime).
pub(crate) fn spawn(shared: Arc<Shared>, once: Arc<Once>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let (s, o) = (shared.clone(), once.clone());
            if let Err(e) = tokio::spawn(async move { settle_round(&s, &o).await }).await {
                tracing::warn!(target: "once::gateway", "a settle round failed: {e}");
            }
            tokio::time::sleep(shared.config.sweep_interval).await;
        }
    })
}

/// The client is gone; calls still running and operations it left unsettled are still ours to finish:
/// wait (at most `shutdown_grace`) while the calls end and the worker settles what they left.
pub(crate) async fn drain(shared: &Shared) {
    drain_until(shared, Instant::now() + shared.config.shutdown_grace).await;
}

/// [`drain`] within a grace that began earlier (HTTP's, at the signal: one `shutdown_grace` in all).
pub(crate) async fn drain_until(shared: &Shared, grace: Instant) {
    while (shared.calls_in_flight() > 0 || shared.has_pending()) && Instant::now() < grace {
        tokio::time::sleep(shared.config.sweep_interval).await;
    }
    if shared.has_pending() || shared.calls_in_flight() > 0 {
        tracing::warn!(
            target: "once::gateway",
            "exiting with unsettled operations: {}",
            who_continues(shared)
        );
    }
}

/// Who settles what a gateway leaves unsettled when it exits: the next gateway of its owner, which reads and
/// sends; `once sweep` has no upstream to read or send through, so it only expires leases and escalates.
pub(crate) fn who_continues(shared: &Shared) -> String {
    format!(
        "the next gateway with owner '{owner}' on this ledger continues them (`once sweep --owner '{owner}'` \
         with its --db only expires their leases and escalates what is past its deadline)",
        owner = shared.owner
    )
}

/// One round of background work: the engine's sweep with every owed dispatch it
/// grants sent; then each operation this gateway answered as unsettled, asked
/// once more (without waiting) until the engine says a repeat would no longer wait.
/// An operation a client's call is going on with is left to that call (`Once::is_driven`).
pub async fn settle_round(shared: &Shared, once: &Arc<Once>) {
    // Up before anything is granted, as for a client's call: a lease then covers only grant to send,
    // never a restart of the upstream (which would spend the attempt as not sent). So a dead upstream
    // is started again by the next round (restarts are paced), even with nothing of this process's
    // own pending: the sweep may grant owed dispatches an earlier process of this owner left. Down,
    // the round goes on (leases expire, escalations are due), and each grant tries to start it again,
    // and is not sent unless it is up before the grant's send-by.
    if let Err(e) = shared.upstream.ready().await {
        tracing::debug!(target: "once::gateway", "settle round: the upstream is not available: {e}");
    }
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
        // The client called again and that call is going on with it: it is that call's to send.
        if once.is_driven(&scope, &key) {
            continue;
        }
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
