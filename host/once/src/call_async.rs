//! The call protocol's loop for async hosts (Cargo feature `tokio`).
//!
//! The same loop as [`Once::call`]'s, in the same shape: start, send each
//! grant and report it, sleep through each wait, stop at the account. What
//! differs is only where the time goes. Each step of the component (and the
//! ledger I/O inside it) runs on tokio's blocking pool, so no async worker
//! thread is held by a database or an fsync; the send and the waits are
//! awaited, so a call that waits for its provider holds no thread at all.
//! And the sender is stopped at the deadline the engine gives its answer
//! ([`Dispatch::answer_by`]): its future is dropped there, so none of its
//! code runs on after the attempt is reported (what it already handed to
//! the network may still reach the provider: the attempt is ambiguous).
//!
//! Dropping a protected call's future is a lost reply: what was being sent
//! may still reach the provider, and its attempt, never reported, expires
//! into unknown and is reconciled (a DIRECT call has no record: it is simply
//! gone). A host whose callers can go away (a server whose
//! framework drops a handler on a client's cancellation) runs each call in a
//! task of its own (`tokio::spawn`) and uses [`Once::call_async_while`] to let
//! a departed caller go at the next wait.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::once::{
    Called, Dispatch, Once, OnceError, Patience, ReadsInARow, Sent, Settled, direct_call, report_failed, trace_step,
};
use crate::types::{Call, Evidence, Reading, Step};

/// Sends what the engine grants, for [`Once::call_async`]: the async counterpart of the closure
/// [`Once::call`] takes.
pub trait Dispatcher: Send {
    /// Send `d` and say what the provider did. A future still running at `d.answer_by` is dropped
    /// there, and the attempt is what [`Dispatcher::stopped`] says. A sender that must wait before
    /// its first byte (a connection, a server starting) checks `d.send_before` just before it.
    fn dispatch(&mut self, d: &Dispatch<'_>) -> impl Future<Output = Sent> + Send;

    /// Read the provider for a `read` step: what it found about `r`'s provider key. `None` (the
    /// default): the [`Provider`](crate::Provider) the [`Once`] was built with answers, on tokio's
    /// blocking pool. A sender that reads through I/O it awaits (a gateway's upstream) answers
    /// here, and no thread waits for the provider. Such a host builds its `Once` with
    /// [`Builder::reads_in_dispatcher`](crate::Builder::reads_in_dispatcher) in place of a
    /// `Provider` (else tools without an explicit `lookup` have none).
    fn read(&mut self, r: &Reading) -> impl Future<Output = Option<Evidence>> + Send {
        let _ = r;
        async { None }
    }

    /// What a dispatch of `d` stopped at its deadline did: [`Sent::Ambiguous`] (it may have reached
    /// the provider), unless this sender knows that nothing of it left ([`Sent::NotSent`]).
    fn stopped(&mut self, d: &Dispatch<'_>) -> Sent {
        let deadline = if d.direct { "its" } else { "send-by plus its" };
        Sent::Ambiguous(format!(
            "no answer by the deadline the engine gave it ({deadline} {} ms timeout): the sender was \
             stopped, and what it sent may have reached the provider",
            d.timeout.as_millis()
        ))
    }
}

/// A step of the component, with the ledger clock and this host's clock read right after it: a
/// grant's `send_by` is turned into this host's time from the two, read together.
type Stepped = (Step, u64, Instant);

impl Once {
    /// [`Once::call_with`] for an async host: the engine's steps on tokio's blocking pool, the sends
    /// and waits awaited. See the [module](crate::call_async) for what dropping its future means.
    pub async fn call_async(self: &Arc<Self>, call: &Call, sender: &mut impl Dispatcher) -> Result<Called, OnceError> {
        self.call_async_while(call, &|| true, sender).await
    }

    /// [`Once::call_async`] for a caller that can go away: at each wait the call goes on only while
    /// `keep_going` says so (as [`Once::call_while`]).
    pub async fn call_async_while(
        self: &Arc<Self>,
        call: &Call,
        keep_going: &(dyn Fn() -> bool + Sync),
        sender: &mut impl Dispatcher,
    ) -> Result<Called, OnceError> {
        let started = call.clone();
        let stepped = self
            .step(move |once| Ok(once.with_instance(|i| i.start(&started))??))
            .await?;
        trace_step("start", &call.scope, &call.tool, &stepped.0);
        self.drive_async(stepped, Some(call), self.wait, keep_going, sender)
            .await
    }

    /// [`Once::resume_within`] for an async host.
    pub async fn resume_async(
        self: &Arc<Self>,
        scope: &str,
        key: &str,
        patience: Duration,
        sender: &mut impl Dispatcher,
    ) -> Result<Called, OnceError> {
        let stepped = self.resume_stepped(scope, key).await?;
        self.drive_async(stepped, None, patience, &|| true, sender).await
    }

    /// [`Once::settle`] for an async host: the sweep, then each owed dispatch granted just before it
    /// is sent, and reported. What a call of this handle is driving now is left to that call.
    pub async fn settle_async(
        self: &Arc<Self>,
        limit: u32,
        sender: &mut impl Dispatcher,
    ) -> Result<Settled, OnceError> {
        let sweep = self
            .blocking(move |once| Ok(once.with_instance(|i| i.sweep(limit, false))??))
            .await?;
        let mut sent = Vec::with_capacity(sweep.owed.len());
        for (scope, key) in &sweep.owed {
            // A call of this handle driving it sends it itself ([`crate::driving`]).
            if self.driving.driven(scope, key) {
                continue;
            }
            // Someone else may have taken it since: then the step says so and nothing is sent.
            let stepped = self.resume_stepped(scope, key).await?;
            if matches!(stepped.0, Step::Dispatch(_)) {
                sent.push(
                    self.drive_async(stepped, None, Duration::ZERO, &|| true, sender)
                        .await?,
                );
            }
        }
        let mut read = Vec::with_capacity(sweep.reads.len());
        for (scope, key) in &sweep.reads {
            if self.driving.driven(scope, key) {
                continue;
            }
            let stepped = self.resume_stepped(scope, key).await?;
            let mut counted = Counted {
                sender: &mut *sender,
                dispatched: false,
            };
            let called = self
                .drive_async(stepped, None, Duration::ZERO, &|| true, &mut counted)
                .await?;
            if counted.dispatched { &mut sent } else { &mut read }.push(called);
        }
        Ok(Settled { sweep, sent, read })
    }

    /// [`Once::call_with`]'s loop, awaiting where that one blocks.
    async fn drive_async(
        self: &Arc<Self>,
        (mut step, mut now, mut at): Stepped,
        call: Option<&Call>,
        patience: Duration,
        keep_going: &(dyn Fn() -> bool + Sync),
        sender: &mut impl Dispatcher,
    ) -> Result<Called, OnceError> {
        let patience = Patience::new(now, patience);
        let mut reads = ReadsInARow::after(call);
        let mut driver = self.driving.driver();
        loop {
            reads.follow(&step)?;
            driver.follow(&step);
            (step, now, at) = match step {
                Step::Dispatch(grant) => {
                    let dispatch = Dispatch::of(&grant, now, at);
                    // Never send after send-by: the whole timeout must end inside the lease. Checked
                    // here, after the step's await: a busy runtime may have woken this task late.
                    let sent = if dispatch.too_late(now) {
                        Sent::NotSent
                    } else {
                        driver.held_until(dispatch.answer_by);
                        let sent = stop_at_deadline(sender, &dispatch).await;
                        driver.held_until(None);
                        sent
                    };
                    let (reported, outcome) = (grant.clone(), sent.clone());
                    match self.step(move |once| once.report(&reported, &outcome)).await {
                        Ok(next) => next,
                        Err(error) => return report_failed(&grant, sent, error),
                    }
                }
                Step::Wait(wait) => {
                    let pause = if keep_going() { patience.pause(&wait, now) } else { None };
                    let Some(pause) = pause else {
                        return Ok(Called::Done(wait.meanwhile));
                    };
                    let wake = tokio::time::Instant::now() + pause;
                    while tokio::time::Instant::now() < wake && keep_going() {
                        tokio::time::sleep_until(wake.min(tokio::time::Instant::now() + Self::KEEP_GOING_POLL)).await;
                    }
                    if !keep_going() {
                        return Ok(Called::Done(wait.meanwhile));
                    }
                    self.resume_stepped(&wait.scope, &wait.key).await?
                }
                Step::Read(reading) => {
                    let evidence = match sender.read(&reading).await {
                        Some(evidence) => evidence,
                        None => {
                            let asked = reading.clone();
                            self.blocking(move |once| once.lookup(&asked)).await?
                        }
                    };
                    let call = reads.starting().cloned();
                    self.step(move |once| once.read_back(call.as_ref(), &reading, &evidence))
                        .await?
                }
                Step::Done(account) => return Ok(Called::Done(account)),
                Step::Direct => {
                    let call = direct_call(call)?;
                    let timeout = self.dispatch_timeout(&call.tool);
                    return Ok(Called::Direct(
                        stop_at_deadline(sender, &Dispatch::direct(call, timeout)).await,
                    ));
                }
            };
        }
    }

    async fn resume_stepped(self: &Arc<Self>, scope: &str, key: &str) -> Result<Stepped, OnceError> {
        let (scope, key) = (scope.to_string(), key.to_string());
        self.step(move |once| once.resume_step(&scope, &key)).await
    }

    /// Run one step of the component on the blocking pool, and read both clocks right after it when
    /// the loop needs them (a grant to hand over, a wait to time): the ledger clock may be a database
    /// query, not worth paying for a step that ends the call (its `now` is then 0, never read).
    async fn step(
        self: &Arc<Self>,
        f: impl FnOnce(&Once) -> Result<Step, OnceError> + Send + 'static,
    ) -> Result<Stepped, OnceError> {
        self.blocking(move |once| {
            let step = f(once)?;
            // This host's clock first: `send_before` is then early by the query's time, never late.
            let at = Instant::now();
            let now = match step {
                Step::Dispatch(_) | Step::Wait(_) => once.now(),
                Step::Read(_) | Step::Done(_) | Step::Direct => 0,
            };
            Ok((step, now, at))
        })
        .await
    }

    /// Run `f` on tokio's blocking pool: the component and the ledger are synchronous.
    async fn blocking<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Once) -> Result<R, OnceError> + Send + 'static,
    ) -> Result<R, OnceError> {
        let once = self.clone();
        tokio::task::spawn_blocking(move || f(&once))
            .await
            .map_err(|e| OnceError::Component(format!("a step of the call did not finish: {e}")))?
    }
}

/// A sender that notes whether it was asked to send ([`Once::settle_async`]'s reads).
struct Counted<'s, D> {
    sender: &'s mut D,
    dispatched: bool,
}

impl<D: Dispatcher> Dispatcher for Counted<'_, D> {
    fn dispatch(&mut self, d: &Dispatch<'_>) -> impl Future<Output = Sent> + Send {
        self.dispatched = true;
        self.sender.dispatch(d)
    }

    fn read(&mut self, r: &Reading) -> impl Future<Output = Option<Evidence>> + Send {
        self.sender.read(r)
    }

    fn stopped(&mut self, d: &Dispatch<'_>) -> Sent {
        self.sender.stopped(d)
    }
}

/// Send `d`, and stop the sender at its deadline.
async fn stop_at_deadline(sender: &mut impl Dispatcher, d: &Dispatch<'_>) -> Sent {
    let Some(answer_by) = d.answer_by else {
        return sender.dispatch(d).await;
    };
    match tokio::time::timeout_at(answer_by.into(), sender.dispatch(d)).await {
        Ok(sent) => sent,
        Err(_) => sender.stopped(d),
    }
}
