//! The `Once` handle: the Rust API over the component.
//!
//! [`Once::call`] runs begin -> dispatch -> finish for one protected tool
//! call; the raw exports are methods of the same name. Every decision comes
//! from the component; this file only moves data and waits.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::bindings::types::{
    Awaited, BeginRequest, Blocked, Decision, Error, Execute, FinishAck, InFlightInfo, JsonError, Outcome, PruneReport,
    RecordSummary, RecordView, ReplayVia, Resolution, Route, Row, Settings, State, SweepReport, ToolDescriptor,
    ToolPolicy, UnknownInfo,
};
use crate::io::{Clock, HostState, LogOperator, NoProvider, Operator, Provider, SystemClock};
use crate::runtime::{GuestLimit, GuestLimits, Instance, Runtime};
use crate::storage::sqlite::{SqliteOptions, SqliteStorage};
use crate::storage::{Stats, Storage, StorageError};

/// Why a call into once failed (as opposed to a decision it made).
#[derive(Debug, thiserror::Error)]
pub enum OnceError {
    /// The engine refused the input or could not use the ledger.
    #[error("{}", .0.message())]
    Engine(#[from] Error),
    /// A JSON input was malformed.
    #[error("invalid JSON: {}", .0.message)]
    Json(#[from] JsonError),
    /// The component trapped or could not be instantiated; nothing was half-written.
    #[error("the once component failed: {0}")]
    Component(String),
    /// The component ran past a per-call limit and was stopped; nothing was half-written.
    #[error("the once component exceeded its {0}")]
    Limit(GuestLimit),
}

/// The owner name of a host that names none (see [`Builder::owner`]).
pub const DEFAULT_OWNER: &str = "default";

/// Default engine settings: 1 MiB JSON inputs, nesting depth 128, 512-byte
/// scopes and keys, no declared clock skew (one host, one clock), owner
/// [`DEFAULT_OWNER`].
pub fn default_settings() -> Settings {
    Settings {
        max_input_bytes: 1 << 20,
        max_depth: 128,
        max_key_bytes: 512,
        clock_skew_ms: 0,
        owner: DEFAULT_OWNER.to_string(),
    }
}

/// What the dispatcher is asked to send.
#[derive(Debug, Clone)]
pub struct Dispatch<'a> {
    /// Scope.
    pub scope: &'a str,
    /// Operation key.
    pub key: &'a str,
    /// Tool.
    pub tool: &'a str,
    /// Attempt number.
    pub attempt: u32,
    /// The key to hand the provider (argument, header): derived from (scope, key).
    pub provider_key: &'a str,
    /// Canonical args to send (a key argument, if any, already set to the provider key).
    pub args: &'a str,
    /// Last moment to send, in the ledger's clock.
    pub send_by: u64,
}

/// What the provider did, as the dispatcher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The effect happened; the response as JSON text.
    Success(String),
    /// The provider answered and did nothing (a definite rejection).
    Rejected(String),
    /// Timeout, disconnect, 5xx after sending, crash: the effect may exist.
    Ambiguous(String),
    /// Nothing was sent (e.g. the connection was refused before any byte left).
    NotSent,
}

/// How a protected call ended. Only [`Called::Confirmed`] and
/// [`Called::Rejected`] are final answers about the effect; every other case
/// says what is still open, so the caller must look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "how the call ended: an unknown, in-flight or unrecorded outcome is not a failure and must not be retried blind"]
pub enum Called {
    /// The effect happened: executed now (`replayed: false`) or answered from the ledger.
    Confirmed {
        /// The receipt (response) as JSON text.
        receipt: String,
        /// Whether it was replayed rather than executed now.
        replayed: bool,
        /// How a replay was matched.
        via: Option<ReplayVia>,
        /// For a replay: when the effect was recorded (ledger clock).
        at: Option<u64>,
        /// For a replay of a derived key: until when identical arguments are this operation.
        window_until: Option<u64>,
    },
    /// The provider definitively rejected the call; nothing happened.
    Rejected {
        /// What the provider said.
        error: String,
    },
    /// The effect may or may not exist; once will not send it again until reconciled.
    Unknown(UnknownInfo),
    /// Another attempt still holds the operation after the wait.
    InFlight(InFlightInfo),
    /// Same key, different payload.
    Conflict(RecordSummary),
    /// Refused.
    Blocked(Blocked),
    /// The effect happened but the ledger could not record it; it will be reconciled.
    Unrecorded {
        /// The response.
        response: String,
    },
    /// A read-only tool was dispatched without a record.
    Direct(Sent),
}

/// One operation record as an operator lists it ([`Once::list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRecord {
    /// Scope.
    pub scope: String,
    /// Operation key.
    pub key: String,
    /// The record's state (the engine always sets one on an operation record).
    pub state: Option<State>,
    /// The record's version, its compare-and-swap counter.
    pub version: u64,
    /// Whose background work may touch it (see [`Builder::owner`]).
    pub owner: Option<String>,
    /// When it next needs attention (lease end, reconciliation, retention), in the ledger's clock.
    pub due_at: Option<u64>,
}

impl From<Row> for ListedRecord {
    fn from(row: Row) -> ListedRecord {
        ListedRecord {
            scope: row.scope,
            key: row.key,
            state: row.state,
            version: row.version,
            owner: row.owner,
            due_at: row.due_at,
        }
    }
}

/// Builds a [`Once`].
pub struct Builder {
    storage: Arc<dyn Storage>,
    clock: Arc<dyn Clock>,
    provider: Arc<dyn Provider>,
    operator: Arc<dyn Operator>,
    settings: Settings,
    policies: Vec<(String, ToolPolicy)>,
    in_flight_wait: Duration,
    runtime: Option<Arc<Runtime>>,
    limits: GuestLimits,
}

impl Builder {
    /// The ledger's clock (default: the system clock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }
    /// The clock leases and read positions are measured in (for PostgreSQL, the
    /// database's), for host code that must stamp times in the same domain.
    pub fn ledger_clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }
    /// The provider lookup used by reconciliation and verify-first.
    pub fn provider(mut self, provider: impl Provider + 'static) -> Self {
        self.provider = Arc::new(provider);
        self
    }
    /// The escalation sink (default: the log).
    pub fn operator(mut self, operator: impl Operator + 'static) -> Self {
        self.operator = Arc::new(operator);
        self
    }
    /// Engine settings (limits, declared clock skew, owner).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }
    /// Who dispatches for this handle (default [`DEFAULT_OWNER`]): records it
    /// creates carry the name, and its sweeps, reconciliation and dispatches
    /// touch only records of this owner. Hosts that can send each other's
    /// operations (replicas of one service) share a name; hosts in front of
    /// different providers on one ledger must not.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.settings.owner = owner.into();
        self
    }
    /// A tool's policy (checked when built).
    pub fn policy(mut self, tool: impl Into<String>, policy: ToolPolicy) -> Self {
        self.policies.push((tool.into(), policy));
        self
    }
    /// How long [`Once::call`] waits for another attempt's outcome (default 10 s).
    pub fn in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }
    /// Use this runtime instead of the process-wide one.
    pub fn runtime(mut self, runtime: Arc<Runtime>) -> Self {
        self.runtime = Some(runtime);
        self
    }
    /// Fuel one export call may burn before it is stopped (default [`GuestLimits::DEFAULT`]).
    pub fn fuel_per_call(mut self, fuel: u64) -> Self {
        self.limits.fuel = fuel;
        self
    }
    /// Largest linear memory of one component instance, in bytes (default [`GuestLimits::DEFAULT`]).
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.limits.memory_bytes = bytes;
        self
    }

    /// Load the component (once per process) and check every policy.
    pub fn build(self) -> Result<Once, OnceError> {
        let runtime = match self.runtime {
            Some(rt) => rt,
            None => Runtime::shared()?,
        };
        let state = HostState {
            storage: self.storage,
            clock: self.clock,
            provider: self.provider,
            operator: self.operator,
            settings: self.settings,
        };
        let once = Once {
            runtime,
            state,
            pool: Mutex::new(Vec::new()),
            policies: RwLock::new(HashMap::new()),
            default_policy: RwLock::new(None),
            in_flight_wait: self.in_flight_wait,
            limits: self.limits,
        };
        for (tool, policy) in self.policies {
            once.set_policy(tool, policy)?;
        }
        Ok(once)
    }
}

/// A handle on the once engine over one ledger. Cheap to share across threads.
pub struct Once {
    runtime: Arc<Runtime>,
    state: HostState,
    pool: Mutex<Vec<Instance>>,
    policies: RwLock<HashMap<String, ToolPolicy>>,
    default_policy: RwLock<Option<ToolPolicy>>,
    in_flight_wait: Duration,
    limits: GuestLimits,
}

impl Once {
    /// Start building a handle over `storage`.
    pub fn builder(storage: impl Storage + 'static) -> Builder {
        Once::builder_over(Arc::new(storage), Arc::new(SystemClock::default()))
    }

    /// Start building a handle over the ledger at `location`: a PostgreSQL URL
    /// (`postgres://…`, with the database's clock as the ledger clock) or an
    /// SQLite file path (created if missing).
    pub fn open(location: &str) -> Result<Builder, OnceError> {
        let opened = crate::storage::open(location).map_err(storage_error)?;
        Ok(Once::builder_over(opened.storage, opened.clock))
    }

    fn builder_over(storage: Arc<dyn Storage>, clock: Arc<dyn Clock>) -> Builder {
        Builder {
            storage,
            clock,
            provider: Arc::new(NoProvider),
            operator: Arc::new(LogOperator),
            settings: default_settings(),
            policies: Vec::new(),
            in_flight_wait: Duration::from_secs(10),
            runtime: None,
            limits: GuestLimits::DEFAULT,
        }
    }

    /// Start building a handle over an SQLite ledger file (created if missing).
    pub fn sqlite(path: impl AsRef<Path>) -> Result<Builder, OnceError> {
        let storage = SqliteStorage::open(path, SqliteOptions::default()).map_err(storage_error)?;
        Ok(Once::builder(storage))
    }

    /// Operation records, optionally only those in `state`, ordered by scope
    /// and key, at most `limit` (what `once ledger list` prints). Read-only.
    pub fn list(&self, state: Option<State>, limit: u32) -> Result<Vec<ListedRecord>, OnceError> {
        let rows = self.state.storage.list(state, limit).map_err(storage_error)?;
        Ok(rows.into_iter().map(ListedRecord::from).collect())
    }

    /// Operation records per state and audit events per kind (what `once ledger stats` prints). Read-only.
    pub fn stats(&self) -> Result<Stats, OnceError> {
        self.state.storage.stats().map_err(storage_error)
    }

    /// The ledger's clock.
    pub fn now(&self) -> u64 {
        self.state.clock.now()
    }

    /// The per-call limits of the component.
    pub fn guest_limits(&self) -> GuestLimits {
        self.limits
    }

    /// Run `f` on a pooled instance (each export call gets a full fuel
    /// budget). A trap or an exhausted limit discards the instance (it is
    /// dropped, not pooled), so no half-finished guest state is ever reused.
    fn with_instance<R>(&self, f: impl FnOnce(&mut Instance) -> Result<R, OnceError>) -> Result<R, OnceError> {
        let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut instance = match pooled {
            Some(instance) => instance,
            None => self.runtime.instantiate_limited(self.state.clone(), &self.limits)?,
        };
        let result = f(&mut instance)?;
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(instance);
        Ok(result)
    }

    /// The engine's default policy for a protected tool.
    pub fn default_policy(&self) -> Result<ToolPolicy, OnceError> {
        if let Some(policy) = self.default_policy.read().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(policy);
        }
        let policy = self.with_instance(Instance::default_policy)?;
        *self.default_policy.write().unwrap_or_else(|p| p.into_inner()) = Some(policy.clone());
        Ok(policy)
    }

    /// Set a tool's policy after the engine has checked it.
    pub fn set_policy(&self, tool: impl Into<String>, policy: ToolPolicy) -> Result<(), OnceError> {
        let tool = tool.into();
        self.with_instance(|i| i.check_policy(&policy))?.map_err(|e| match e {
            Error::InvalidPolicy(m) => Error::InvalidPolicy(format!("tool {tool}: {m}")),
            other => other,
        })?;
        self.policies
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tool, policy);
        Ok(())
    }

    /// The policy of `tool`: its own, or the default.
    pub fn policy(&self, tool: &str) -> Result<ToolPolicy, OnceError> {
        match self.policies.read().unwrap_or_else(|p| p.into_inner()).get(tool) {
            Some(policy) => Ok(policy.clone()),
            None => self.default_policy(),
        }
    }

    /// The route of a tool from its policy and descriptor.
    pub fn route(&self, tool: &str, descriptor: Option<&ToolDescriptor>) -> Result<Route, OnceError> {
        let policy = self.policy(tool)?;
        self.with_instance(|i| i.route_of(&policy, descriptor))
    }

    /// The `begin` export.
    pub fn begin(&self, request: &BeginRequest) -> Result<Decision, OnceError> {
        let decision = self.with_instance(|i| i.begin(request))??;
        trace_decision("begin", &request.scope, &request.tool, &decision);
        Ok(decision)
    }

    /// The `finish` export.
    pub fn finish(&self, scope: &str, key: &str, fence: &str, outcome: &Outcome) -> Result<FinishAck, OnceError> {
        let call = || self.with_instance(|i| i.finish(scope, key, fence, outcome));
        // Only a success's commit may be deferred (DESIGN.md "Durability budget"): a lost
        // success is found again by reconciliation, but a lost rejection would turn a
        // reported refusal into an owed dispatch.
        let ack = match outcome {
            Outcome::Success(_) => crate::io::deferring_commits(call),
            _ => call(),
        }??;
        tracing::info!(target: "once", scope, key, ?ack, "finish");
        Ok(ack)
    }

    /// The `reconcile` export.
    pub fn reconcile(&self, scope: &str, key: &str) -> Result<Decision, OnceError> {
        let decision = self.with_instance(|i| i.reconcile(scope, key))??;
        trace_decision("reconcile", scope, "", &decision);
        Ok(decision)
    }

    /// The `await-holder` export: for a caller answered `in-flight`, the holder's outcome once there is one.
    pub fn await_holder(&self, scope: &str, key: &str) -> Result<Awaited, OnceError> {
        Ok(self.with_instance(|i| i.await_holder(scope, key))??)
    }

    /// The `sweep` export.
    pub fn sweep(&self, limit: u32) -> Result<SweepReport, OnceError> {
        Ok(self.with_instance(|i| i.sweep(limit))??)
    }

    /// The `prune` export.
    pub fn prune(&self, limit: u32) -> Result<PruneReport, OnceError> {
        Ok(self.with_instance(|i| i.prune(limit))??)
    }

    /// The `inspect` export.
    pub fn inspect(&self, scope: &str, key: &str) -> Result<Option<RecordView>, OnceError> {
        Ok(self.with_instance(|i| i.inspect(scope, key))??)
    }

    /// The `resolve` export (operator resolution, audited with `note`).
    pub fn resolve(
        &self,
        scope: &str,
        key: &str,
        resolution: &Resolution,
        note: &str,
        force: bool,
    ) -> Result<State, OnceError> {
        Ok(self.with_instance(|i| i.resolve(scope, key, resolution, note, force))??)
    }

    /// RFC 8785 canonical form of a JSON text, computed by the component.
    pub fn canonicalize(&self, json: &[u8]) -> Result<String, OnceError> {
        Ok(self.with_instance(|i| i.canonicalize(json))??)
    }

    /// `sha256(JCS({"tool":…,"args":…}))`, computed by the component.
    pub fn fingerprint(&self, tool: &str, args: &str) -> Result<String, OnceError> {
        Ok(self.with_instance(|i| i.fingerprint(tool, args))??)
    }

    /// A begin request for `tool` under its policy, with the application's key.
    pub fn request(&self, scope: &str, key: Option<&str>, tool: &str, args: &str) -> Result<BeginRequest, OnceError> {
        Ok(BeginRequest {
            scope: scope.to_string(),
            keys: key
                .map(|k| vec![("application".to_string(), k.to_string())])
                .unwrap_or_default(),
            tool: tool.to_string(),
            args: args.to_string(),
            policy: self.policy(tool)?,
            descriptor: None,
            supersedes: None,
            acknowledge_confirmed: false,
        })
    }

    /// Protect one tool call: begin, dispatch (only when the engine says
    /// execute), finish, and on a lost reply reconcile before anything is sent
    /// again. `key` is the operation key the application minted before the
    /// first attempt; `None` only for tools whose identity may be derived.
    pub fn call(
        &self,
        scope: &str,
        key: Option<&str>,
        tool: &str,
        args: &str,
        dispatch: impl FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Called, OnceError> {
        let request = self.request(scope, key, tool, args)?;
        self.call_with(&request, dispatch)
    }

    /// [`Once::call`] with a full request (descriptor, supersedes, several key carriers).
    pub fn call_with(
        &self,
        request: &BeginRequest,
        dispatch: impl FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Called, OnceError> {
        Ok(self.call_keyed(request, dispatch)?.1)
    }

    /// [`Once::call_with`], also naming the operation key the engine used (a
    /// derived one included); none for a direct or refused call.
    pub fn call_keyed(
        &self,
        request: &BeginRequest,
        mut dispatch: impl FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<(Option<String>, Called), OnceError> {
        let decision = self.begin(request)?;
        if decision == Decision::Direct {
            let direct = Dispatch {
                scope: &request.scope,
                key: "",
                tool: &request.tool,
                attempt: 0,
                provider_key: "",
                args: &request.args,
                send_by: u64::MAX,
            };
            return Ok((None, Called::Direct(dispatch(&direct))));
        }
        let key = key_of(&decision).map(str::to_string);
        let called = self.drive(
            &request.scope,
            &request.tool,
            decision,
            request.policy.attempt_budget,
            &mut dispatch,
        )?;
        Ok((key, called))
    }

    /// Continue an operation from the ledger (after a crash, or for an owed
    /// dispatch): reconcile, then dispatch only if the engine says execute.
    pub fn resume(
        &self,
        scope: &str,
        key: &str,
        tool: &str,
        mut dispatch: impl FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Called, OnceError> {
        let decision = self.reconcile(scope, key)?;
        let budget = self.policy(tool)?.attempt_budget;
        self.drive(scope, tool, decision, budget, &mut dispatch)
    }

    /// Follow decisions until one is final. Each step is bounded by the
    /// engine's attempt budget, so this loop ends.
    fn drive(
        &self,
        scope: &str,
        tool: &str,
        mut decision: Decision,
        budget: u32,
        dispatch: &mut dyn FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Called, OnceError> {
        let mut reconciled = false;
        for _ in 0..(budget as usize) * 2 + 4 {
            decision = match decision {
                Decision::Execute(grant) => match self.execute(scope, tool, &grant, dispatch)? {
                    Step::Done(called) => return Ok(called),
                    Step::Again(next) => {
                        reconciled = true;
                        next
                    }
                },
                Decision::Replay(r) => {
                    return Ok(Called::Confirmed {
                        receipt: r.receipt,
                        replayed: true,
                        via: Some(r.via),
                        at: Some(r.at),
                        window_until: r.window_until,
                    });
                }
                // A lost reply is reconciled before anything is sent again.
                Decision::Unknown(u) if !reconciled => {
                    reconciled = true;
                    self.reconcile(scope, &u.key)?
                }
                Decision::Unknown(u) => return Ok(Called::Unknown(u)),
                Decision::InFlight(info) => match self.wait_for_holder(scope, info)? {
                    Waited::Done(called) => return Ok(called),
                    Waited::Decided(next) => next,
                },
                Decision::Conflict(summary) => return Ok(Called::Conflict(summary)),
                Decision::Blocked(blocked) => return Ok(Called::Blocked(blocked)),
                Decision::Direct => unreachable!("direct is answered before the protocol starts"),
            };
        }
        Err(OnceError::Component(
            "the engine kept granting attempts past the attempt budget".to_string(),
        ))
    }

    /// Dispatch one granted attempt and record its outcome.
    fn execute(
        &self,
        scope: &str,
        tool: &str,
        grant: &Execute,
        dispatch: &mut dyn FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Step, OnceError> {
        // Never send after the lease: re-check the clock right before sending.
        let sent = if self.state.clock.now() >= grant.send_by {
            Sent::NotSent
        } else {
            dispatch(&Dispatch {
                scope,
                key: &grant.key,
                tool,
                attempt: grant.attempt,
                provider_key: &grant.provider_key,
                args: &grant.args,
                send_by: grant.send_by,
            })
        };
        let outcome = match &sent {
            Sent::Success(response) => Outcome::Success(response.clone()),
            Sent::Rejected(error) => Outcome::Rejected(error.clone()),
            Sent::Ambiguous(reason) => Outcome::Ambiguous(reason.clone()),
            Sent::NotSent => Outcome::NotSent,
        };
        let (sent, ack) = match (self.finish(scope, &grant.key, &grant.fence, &outcome), sent) {
            (Ok(ack), sent) => (sent, ack),
            // The effect happened; an error here would make the caller believe it did not. The
            // record stays in flight, expires into unknown and is reconciled.
            (Err(e), Sent::Success(response)) => {
                tracing::warn!(target: "once", scope, key = grant.key, "finish failed after a success: {e}");
                return Ok(Step::Done(Called::Unrecorded { response }));
            }
            (Err(e), _) => return Err(e),
        };
        Ok(match (sent, ack) {
            (Sent::Success(response), FinishAck::Unrecorded) => Step::Done(Called::Unrecorded { response }),
            (Sent::Success(receipt), _) => Step::Done(Called::Confirmed {
                receipt,
                replayed: false,
                via: None,
                at: None,
                window_until: None,
            }),
            // A rejection is reported only once the ledger holds it; otherwise the caller is
            // told what the record says, because the record may still be dispatched.
            (Sent::Rejected(error), FinishAck::Recorded(State::Failed)) => Step::Done(Called::Rejected { error }),
            (_, FinishAck::Unrecorded) => Step::Done(Called::InFlight(InFlightInfo {
                key: grant.key.clone(),
                lease_until: grant.lease_until,
            })),
            // Not sent, a lost reply, or a rejection that came after the record moved on:
            // the engine says what happens next (the next attempt, a reconciliation, …).
            (Sent::Rejected(_) | Sent::NotSent | Sent::Ambiguous(_), _) => {
                Step::Again(self.reconcile(scope, &grant.key)?)
            }
        })
    }

    /// Wait (bounded by `in_flight_wait`) for another attempt's holder: the
    /// engine says when it has an outcome to take; this only polls and sleeps.
    fn wait_for_holder(&self, scope: &str, mut held: InFlightInfo) -> Result<Waited, OnceError> {
        let give_up = Instant::now() + self.in_flight_wait;
        let mut pause = Duration::from_millis(5);
        loop {
            match self.await_holder(scope, &held.key)? {
                Awaited::Pending(info) => held = info,
                Awaited::Rejected(error) => return Ok(Waited::Done(Called::Rejected { error })),
                Awaited::Decided(decision) => {
                    trace_decision("await-holder", scope, "", &decision);
                    return Ok(Waited::Decided(decision));
                }
            }
            if Instant::now() >= give_up {
                return Ok(Waited::Done(Called::InFlight(held)));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

#[must_use]
enum Waited {
    Done(Called),
    Decided(Decision),
}

#[must_use]
enum Step {
    Done(Called),
    Again(Decision),
}

/// A storage failure as the engine reports one (`Error::Storage`).
fn storage_error(e: StorageError) -> OnceError {
    OnceError::Engine(Error::Storage(e.0))
}

/// The operation key a decision names, if any.
fn key_of(decision: &Decision) -> Option<&str> {
    match decision {
        Decision::Execute(e) => Some(&e.key),
        Decision::Replay(r) => Some(&r.key),
        Decision::Conflict(c) => Some(&c.key),
        Decision::InFlight(i) => Some(&i.key),
        Decision::Unknown(u) => Some(&u.key),
        Decision::Blocked(_) | Decision::Direct => None,
    }
}

fn trace_decision(export: &str, scope: &str, tool: &str, decision: &Decision) {
    let key = key_of(decision).unwrap_or_default();
    let attempt = match decision {
        Decision::Execute(e) => Some(e.attempt),
        _ => None,
    };
    tracing::info!(target: "once", export, scope, key, tool, decision = decision.name(), attempt, "decision");
}
