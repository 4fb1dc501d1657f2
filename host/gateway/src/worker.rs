//! The background worker: every `sweep_interval` one settle round (the
//! engine's sweep of this gateway's records, then every owed dispatch sent
//! with its original provider key), and before exit the wait for what this
//! gateway answered as unsettled.

use std::sync::Arc;
use std::time::Instant;

use once::Once;
use once::types::State;
use tokio::task::JoinHandle;

use crate::handler::{Shared, called_name, dispatch};
use crate::reply::Capture;

/// Run [`settle_round`] every `sweep_interval`, until the task is aborted.
pub(crate) fn spawn(shared: Arc<Shared>, once: Arc<Once>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let (s, o) = (shared.clone(), once.clone());
            let _ = tokio::task::spawn_blocking(move || settle_round(&s, &o)).await;
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

/// One round of background work: sweep this gateway's records (the engine lists every
/// dispatch still owed, whenever it was proven), then send each with its original provider key.
pub fn settle_round(shared: &Shared, once: &Once) {
    let owed = match once.sweep(200) {
        Ok(report) => report.owed,
        Err(e) => {
            tracing::warn!(target: "once::gateway", "sweep: {e}");
            Vec::new()
        }
    };
    for (scope, key) in owed {
        let tool = match once.inspect(&scope, &key) {
            Ok(Some(view)) => view.tool,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(target: "once::gateway", scope, key, "inspect: {e}");
                continue;
            }
        };
        let plan = match shared.plan(once, &tool) {
            Ok(plan) => plan,
            Err(e) => {
                tracing::warn!(target: "once::gateway", tool, "{e}");
                continue;
            }
        };
        let mut capture = Capture::default();
        let called = once.resume(&scope, &key, &tool, |d| dispatch(shared, once, &plan, d, &mut capture));
        tracing::info!(target: "once::gateway", scope, key, tool, outcome = ?called.as_ref().map(called_name), "owed dispatch");
    }
    for (scope, key) in shared.pending() {
        let open = matches!(
            once.inspect(&scope, &key).map(|v| v.map(|v| v.state)),
            Ok(Some(State::InFlight | State::Unknown | State::Absent))
        );
        if !open {
            shared.settled(scope, key);
        }
    }
}
