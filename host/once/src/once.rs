//! The `Once` handle: the Rust API over the component.
//!
//! [`Once::call`] runs the call protocol for one tool call, the same loop
//! every host runs: start it, send each grant the engine gives (and report
//! what happened), sleep through each wait, and stop at the account the
//! engine states. Every decision — retries, reconciliation, waiting for
//! another attempt, what the outcome means — is the component's; this file
//! only moves data, sends and sleeps. What operators do with a handle
//! (sweeps that send nothing, inspection, resolution, listings, single
//! transitions) is [`crate::operators`].

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::bindings::types::{
    Account, Blocked, Call, Configuration, Configured, ConfirmedInfo, Effect, Ending, Error, Evidence, Grant,
    JsonError, LedgerEncoding, Outcome, PolicyInput, ProviderReads, Reading, Settings, Step, SweepResult, ToolConfig,
    ToolDescriptor, ToolPlan, ToolPolicy, Waiting,
};
use crate::driving::Driving;
use crate::io::{Clock, Entropy, HostState, LogOperator, NoProvider, Operator, Provider, SystemClock, SystemEntropy};
use crate::runtime::{GuestLimit, GuestLimits, Instance, Runtime};
use crate::storage::sqlite::{SqliteOptions, SqliteStorage};
use crate::storage::{Storage, StorageError};

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

/// The engine's default settings, as the component states them.
pub fn default_settings() -> Result<Settings, OnceError> {
    Runtime::shared()?.default_settings()
}

/// What the dispatcher is asked to send: a granted attempt of a protected
/// call, or (`direct`) a DIRECT call sent as it came.
#[derive(Debug, Clone)]
pub struct Dispatch<'a> {
    /// A DIRECT call (the engine's `direct` step: a read-only tool), sent
    /// unprotected: nothing is recorded or reported, and it has no key, attempt
    /// or provider key (empty, 0 and empty). Tell the two kinds apart by this,
    /// never by those values.
    pub direct: bool,
    /// Scope: the call's own, for a DIRECT call too.
    pub scope: &'a str,
    /// Operation key (empty for a DIRECT call).
    pub key: &'a str,
    /// Tool.
    pub tool: &'a str,
    /// Attempt number, from 1 (0 for a DIRECT call).
    pub attempt: u32,
    /// The key to hand the provider (argument, header): derived from (scope, key); empty for a DIRECT call.
    pub provider_key: &'a str,
    /// The args to send (a key argument, if any, already set to the provider key).
    pub args: &'a str,
    /// Do not start sending at or after this (ledger clock); the loop checks it just before it hands
    /// the dispatch over.
    pub send_by: u64,
    /// `send_by` on this host's monotonic clock, as the ledger clock stood when the dispatch was handed
    /// over (`None` for a DIRECT call): a dispatcher that must wait before its first byte (a connection,
    /// an upstream starting) checks this, never the ledger clock, which may be a database query.
    pub send_before: Option<Instant>,
    /// How long to wait for the provider's answer; no answer in time is [`Sent::Ambiguous`].
    pub timeout: Duration,
    /// The deadline the engine gives the answer: `send_by` plus the timeout (inside the lease, less the
    /// clock skew), or for a DIRECT call the timeout from when it is handed over. `Once::call_async`
    /// (feature `tokio`) stops its sender here, which may be later than the timeout from the first byte
    /// (send-by leaves the slack of the lease); a blocking dispatcher ([`Once::call`]) cannot be stopped
    /// from outside and must return by then itself (one that runs on past it may outlive its lease).
    /// `None` only for a timeout beyond the range of this host's clock.
    pub answer_by: Option<Instant>,
}

impl<'a> Dispatch<'a> {
    /// The dispatch of `grant`, handed over when the ledger clock read `now` and this host's clock `handed`.
    pub(crate) fn of(grant: &'a Grant, now: u64, handed: Instant) -> Dispatch<'a> {
        let timeout = Duration::from_millis(grant.timeout_ms);
        let left = Duration::from_millis(grant.send_by.saturating_sub(now));
        Dispatch {
            direct: false,
            scope: &grant.scope,
            key: &grant.key,
            tool: &grant.tool,
            attempt: grant.attempt,
            provider_key: &grant.provider_key,
            args: &grant.args,
            send_by: grant.send_by,
            send_before: handed.checked_add(left),
            timeout,
            answer_by: handed.checked_add(left.saturating_add(timeout)),
        }
    }

    /// Whether it may no longer be sent: `send_by` has come on the ledger clock as read at `now`, or
    /// `send_before` has on this host's, which also counts the time that read took (a database query)
    /// and any wait since (a busy runtime waking the loop late). Checked just before the hand-over.
    pub(crate) fn too_late(&self, now: u64) -> bool {
        now >= self.send_by || self.send_before.is_some_and(|end| Instant::now() >= end)
    }

    /// A DIRECT call of `call`, sent as it came, with the tool's dispatch timeout.
    pub(crate) fn direct(call: &'a Call, timeout: Duration) -> Dispatch<'a> {
        let handed = Instant::now();
        Dispatch {
            direct: true,
            scope: &call.scope,
            key: "",
            tool: &call.tool,
            attempt: 0,
            provider_key: "",
            args: &call.args,
            send_by: u64::MAX,
            send_before: None,
            timeout,
            answer_by: handed.checked_add(timeout),
        }
    }
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

impl Sent {
    fn outcome(&self) -> Outcome {
        match self {
            Sent::Success(response) => Outcome::Success(response.clone()),
            Sent::Rejected(error) => Outcome::Rejected(error.clone()),
            Sent::Ambiguous(reason) => Outcome::Ambiguous(reason.clone()),
            Sent::NotSent => Outcome::NotSent,
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "how the call ended: an unknown, in-flight or unrecorded outcome is not a failure and must not be retried blind"]
pub enum Called {
    /// A protected call ended (or the wait for it was given up): the engine's account of it.
    Done(Account),
    /// The effect happened, but recording it failed inside once (the component stopped);
    /// the record expires into unknown and is reconciled. Never a reason to mint a new intent.
    Unreported {
        /// The provider's response.
        response: String,
        /// What failed.
        error: String,
    },
    /// A DIRECT tool was sent unprotected; what the dispatcher saw.
    Direct(Sent),
}

impl Called {
    /// The account of a protected call.
    pub fn account(&self) -> Option<&Account> {
        match self {
            Called::Done(account) => Some(account),
            _ => None,
        }
    }

    /// How a protected call ended.
    pub fn ending(&self) -> Option<&Ending> {
        self.account().map(|a| &a.ending)
    }

    /// The confirmation of a call whose effect is recorded (sent now or replayed).
    pub fn confirmed(&self) -> Option<&ConfirmedInfo> {
        match self.ending() {
            Some(Ending::Confirmed(c)) => Some(c),
            _ => None,
        }
    }

    /// The refusal of a call that was blocked before anything was sent.
    pub fn blocked(&self) -> Option<&Blocked> {
        match self.ending() {
            Some(Ending::Blocked(b)) => Some(b),
            _ => None,
        }
    }

    /// Whether the effect happened, as far as the ledger knows (a DIRECT call's is not tracked).
    pub fn effect(&self) -> Effect {
        match self {
            Called::Done(account) => account.effect,
            Called::Unreported { .. } => Effect::Happened,
            Called::Direct(_) => Effect::Unknown,
        }
    }

    /// The receipt of a confirmed call (or the response of one that was not recorded).
    pub fn receipt(&self) -> Option<&str> {
        match self {
            Called::Done(Account {
                ending: Ending::Confirmed(c),
                ..
            }) => Some(&c.receipt),
            Called::Done(Account {
                ending: Ending::Unrecorded(u),
                ..
            }) => Some(&u.response),
            Called::Unreported { response, .. } => Some(response),
            _ => None,
        }
    }
}

/// What [`Once::settle`] did: the sweep's counts, and how each owed dispatch it sent ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "how each owed dispatch ended: an unknown one is not a failure"]
pub struct Settled {
    /// The sweep's counts; `owed` lists the owed dispatches it found, each granted
    /// just before it was sent (unless another host took it first, or a call of this
    /// handle is driving it: then it is that call's to send). `dispatches` is empty.
    pub sweep: SweepResult,
    /// Each owed dispatch sent, and how it ended: those the sweep listed, and those a due
    /// read of this round proved owed.
    pub sent: Vec<Called>,
    /// Each other due read the sweep listed (`sweep.reads`), made, and what the engine then
    /// answered (the effect found, or still unknown): nothing was sent for it.
    pub read: Vec<Called>,
}

/// Builds a [`Once`].
pub struct Builder {
    storage: Arc<dyn Storage>,
    clock: Arc<dyn Clock>,
    provider: Option<Arc<dyn Provider>>,
    reads_in_dispatcher: bool,
    operator: Arc<dyn Operator>,
    entropy: Arc<dyn Entropy>,
    settings: Option<Settings>,
    owner: Option<String>,
    clock_skew: Option<Duration>,
    defaults: PolicyInput,
    tools: Vec<ToolConfig>,
    wait: Duration,
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
    /// The provider's authoritative read, used by reconciliation and verify-first.
    /// Without one, tools default to no lookup: an unknown outcome waits for an
    /// operator, or for a handle with a provider, whose sweep or next call on
    /// the key reads it. The choice is kept with every record a handle creates,
    /// so hosts sharing a ledger should share their provider (or set `lookup`
    /// explicitly in the policy, for a host that leaves reading to another).
    pub fn provider(mut self, provider: impl Provider + 'static) -> Self {
        self.provider = Some(Arc::new(provider));
        self
    }
    /// The provider is read by the async `Dispatcher`'s `read` (the `tokio` feature), not by a
    /// [`Provider`]: tools keep a lookup by default, as with [`Builder::provider`]
    /// (without either, tools default to none). For a host that reads through
    /// I/O it awaits and calls only `Once::call_async` and its siblings; a
    /// blocking call that comes to a read on such a handle is refused
    /// (`invalid-request`), and nothing is recorded of a read it did not make.
    pub fn reads_in_dispatcher(mut self) -> Self {
        self.reads_in_dispatcher = true;
        self
    }
    /// The escalation sink (default: the log).
    pub fn operator(mut self, operator: impl Operator + 'static) -> Self {
        self.operator = Arc::new(operator);
        self
    }
    /// Where the bytes of the ledger's provider-key secret come from when a
    /// ledger has none yet (default: the operating system, [`SystemEntropy`]).
    /// A deployment that must derive the same provider keys after losing its
    /// ledger file (so `verify_first` still finds effects dispatched before
    /// the loss) keeps 32 secret bytes outside the ledger and passes them as
    /// a [`crate::FixedEntropy`]: the recreated secret is then the old one.
    /// A ledger that already holds a secret keeps its own (docs/design.md
    /// "Provider keys and the ledger's secret").
    pub fn entropy(mut self, entropy: impl Entropy + 'static) -> Self {
        self.entropy = Arc::new(entropy);
        self
    }
    /// Engine settings, whole (start from [`default_settings`]).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = Some(settings);
        self
    }
    /// Who dispatches for this handle (default [`DEFAULT_OWNER`]): records it
    /// creates carry the name, and its sweeps, reconciliation and dispatches
    /// touch only records of this owner. Hosts that can send each other's
    /// operations (replicas of one service) share a name; hosts in front of
    /// different providers on one ledger must not.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }
    /// The declared bound on skew between the clocks of hosts sharing the ledger.
    pub fn clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = Some(skew);
        self
    }
    /// What applies to every tool for what its own policy leaves unset, and to tools not named.
    pub fn defaults(mut self, defaults: PolicyInput) -> Self {
        self.defaults = defaults;
        self
    }
    /// A tool's policy as configured (the engine fills the rest and checks it when built).
    pub fn policy(self, tool: impl Into<String>, policy: PolicyInput) -> Self {
        self.tool(tool, policy, None)
    }
    /// A tool's policy and its advertised definition (routing by annotations, pinning).
    pub fn tool(mut self, tool: impl Into<String>, policy: PolicyInput, descriptor: Option<ToolDescriptor>) -> Self {
        self.tools.push(ToolConfig {
            tool: tool.into(),
            policy,
            descriptor,
        });
        self
    }
    /// How long [`Once::call`] waits — for another attempt's outcome, or a read
    /// that is due — before it answers what is known meanwhile (default 10 s).
    pub fn wait_up_to(mut self, wait: Duration) -> Self {
        self.wait = wait;
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

    /// Load the component (once per process), and configure it: the engine
    /// fills every unset setting and policy field and checks them all now,
    /// not at the first call. Then settle the ledger's body format with the
    /// engine's ([`Storage::claim_body_format`]): a ledger holding row bodies
    /// of a later format than this build reads is refused with a storage
    /// error that names the ledger and both formats.
    pub fn build(self) -> Result<Once, OnceError> {
        let runtime = match self.runtime {
            Some(rt) => rt,
            None => Runtime::shared()?,
        };
        let mut settings = match self.settings {
            Some(settings) => settings,
            None => runtime.default_settings()?,
        };
        if let Some(owner) = self.owner {
            settings.owner = owner;
        }
        if let Some(skew) = self.clock_skew {
            settings.clock_skew_ms = skew.as_millis() as u64;
        }
        let mut defaults = self.defaults;
        // A fact of this host: without a provider, no tool can be read.
        if self.provider.is_none() && !self.reads_in_dispatcher && defaults.lookup.is_none() {
            defaults.lookup = Some(false);
        }
        // A handle whose Dispatcher reads has no read of its own for a blocking loop to make.
        let reads_only_in_dispatcher = self.reads_in_dispatcher && self.provider.is_none();
        let host = HostState {
            storage: self.storage,
            clock: self.clock,
            provider: self.provider.unwrap_or_else(|| Arc::new(NoProvider)),
            operator: self.operator,
            entropy: self.entropy,
        };
        let configuration = Configuration {
            settings,
            defaults,
            tools: self.tools,
            // Static bindings: the ledger answers in WIT types, no codec.
            ledger_encoding: LedgerEncoding::Typed,
            // A read is I/O this host does between steps: the async loop awaits it, holding no
            // thread, and no step of the component waits inside for the provider.
            reads: ProviderReads::Steps,
        };
        let once = Once {
            runtime,
            host,
            pool: Mutex::new(Vec::new()),
            config: RwLock::new(Config {
                configuration: configuration.clone(),
                configured: None,
                generation: 0,
            }),
            wait: self.wait,
            limits: self.limits,
            reads_only_in_dispatcher,
            driving: Driving::default(),
        };
        let configured = once.reconfigure(configuration)?;
        // Configuring reads no row; everything after may. A ledger holding
        // bodies of a later format than this engine's is refused here, not
        // misread by the first sweep, and a ledger without one gets it.
        once.host
            .storage
            .claim_body_format(configured.body_format)
            .map_err(storage_error)?;
        Ok(once)
    }
}

/// The configuration every instance runs with, and what the engine made of it.
struct Config {
    configuration: Configuration,
    configured: Option<Configured>,
    generation: u64,
}

/// A handle on the once engine over one ledger. Cheap to share across threads.
pub struct Once {
    runtime: Arc<Runtime>,
    pub(crate) host: HostState,
    pool: Mutex<Vec<Instance>>,
    config: RwLock<Config>,
    pub(crate) wait: Duration,
    limits: GuestLimits,
    /// Built with [`Builder::reads_in_dispatcher`] and no [`Provider`]: a `read` step outside an
    /// async loop whose `Dispatcher` reads is refused, never answered "unknown" (which the engine
    /// would record as an inconclusive read and schedule the next one later).
    reads_only_in_dispatcher: bool,
    /// The operations a call loop of this handle is driving now: a settle round leaves them to it.
    pub(crate) driving: Driving,
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
            provider: None,
            reads_in_dispatcher: false,
            operator: Arc::new(LogOperator),
            entropy: Arc::new(SystemEntropy),
            settings: None,
            owner: None,
            clock_skew: None,
            defaults: crate::policy_input(),
            tools: Vec::new(),
            wait: Duration::from_secs(10),
            runtime: None,
            limits: GuestLimits::DEFAULT,
        }
    }

    /// Start building a handle over an SQLite ledger file (created if missing).
    pub fn sqlite(path: impl AsRef<Path>) -> Result<Builder, OnceError> {
        let storage = SqliteStorage::open(path, SqliteOptions::default()).map_err(storage_error)?;
        Ok(Once::builder(storage))
    }

    // ------------------------------------------------------------ configuration

    /// Check `configuration` on a fresh instance; on success every instance runs it from now on.
    fn reconfigure(&self, configuration: Configuration) -> Result<Configured, OnceError> {
        let generation = self.read_config(|c| c.generation) + 1;
        let mut instance = self.runtime.instantiate_limited(self.host.clone(), &self.limits)?;
        let configured = instance.configure(&configuration, generation)??;
        let mut config = self.config.write().unwrap_or_else(|p| p.into_inner());
        *config = Config {
            configuration,
            configured: Some(configured.clone()),
            generation,
        };
        drop(config);
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(instance);
        Ok(configured)
    }

    fn read_config<R>(&self, f: impl FnOnce(&Config) -> R) -> R {
        f(&self.config.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Configure (or reconfigure) one tool: its policy as configured, and its definition if known.
    pub fn set_tool(
        &self,
        tool: impl Into<String>,
        policy: PolicyInput,
        descriptor: Option<ToolDescriptor>,
    ) -> Result<ToolPlan, OnceError> {
        let tool = tool.into();
        let mut configuration = self.read_config(|c| c.configuration.clone());
        configuration.tools.retain(|t| t.tool != tool);
        configuration.tools.push(ToolConfig {
            tool: tool.clone(),
            policy,
            descriptor,
        });
        let configured = self.reconfigure(configuration)?;
        Ok(plan_of(&configured, &tool))
    }

    /// What the engine made of the configuration: every tool's route and policy.
    pub fn configured(&self) -> Configured {
        self.read_config(|c| c.configured.clone().expect("a built handle is configured"))
    }

    /// How `tool` is handled: its route and policy, every field decided.
    pub fn plan(&self, tool: &str) -> ToolPlan {
        // One tool's plan, not a copy of every tool's: gateways ask on every call.
        self.read_config(|c| plan_of(c.configured.as_ref().expect("a built handle is configured"), tool))
    }

    /// Bind `name` to `holder` in the ledger unless it is bound already, and return the holder
    /// it is bound to (see [`Storage::bind`]): how a gateway keeps a second upstream out of the
    /// scopes it serves.
    pub fn bind(&self, name: &str, holder: &str) -> Result<String, OnceError> {
        self.host.storage.bind(name, holder).map_err(storage_error)
    }

    /// Hand every ledger binding held by `from` to `to` (see [`Storage::rebind`]): with
    /// [`Once::adopt`], an operator moving a renamed gateway's records and scopes to its new name.
    pub fn rebind(&self, from: &str, to: &str) -> Result<Vec<String>, OnceError> {
        self.host.storage.rebind(from, to).map_err(storage_error)
    }

    /// The policy of `tool`, every field decided.
    pub fn policy(&self, tool: &str) -> ToolPolicy {
        self.plan(tool).policy
    }

    /// Run `f` on a pooled instance configured with the current configuration
    /// (each export call gets a full fuel budget). A trap or an exhausted limit
    /// discards the instance (it is dropped, not pooled), so no half-finished
    /// guest state is ever reused.
    pub(crate) fn with_instance<R>(
        &self,
        f: impl FnOnce(&mut Instance) -> Result<R, OnceError>,
    ) -> Result<R, OnceError> {
        let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut instance = match pooled {
            Some(instance) => instance,
            None => self.runtime.instantiate_limited(self.host.clone(), &self.limits)?,
        };
        let generation = self.read_config(|c| c.generation);
        if instance.configured() != Some(generation) {
            // Cloned only here, not on every call: a warm instance already runs this generation.
            let (configuration, generation) = self.read_config(|c| (c.configuration.clone(), c.generation));
            // It was accepted when it was set: refused now, the component changed under us.
            instance.configure(&configuration, generation)??;
        }
        let result = f(&mut instance)?;
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(instance);
        Ok(result)
    }

    // ------------------------------------------------------------ the call protocol

    /// A call of `tool` with the application's operation key (or none, for a derived one).
    pub fn call_of(scope: &str, key: Option<&str>, tool: &str, args: &str) -> Call {
        Call {
            scope: scope.to_string(),
            keys: key
                .map(|k| vec![("application".to_string(), k.to_string())])
                .unwrap_or_default(),
            tool: tool.to_string(),
            args: args.to_string(),
            supersedes: None,
            acknowledge_confirmed: false,
        }
    }

    /// Protect one tool call. `key` is the operation key the application
    /// minted before the first attempt (`None` for a derived key); `send`
    /// sends one grant and says what the provider did.
    pub fn call(
        &self,
        scope: &str,
        key: Option<&str>,
        tool: &str,
        args: &str,
        send: impl FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Called, OnceError> {
        self.call_with(&Once::call_of(scope, key, tool, args), send)
    }

    /// [`Once::call`] with a whole call (several key carriers, supersedes).
    pub fn call_with(&self, call: &Call, send: impl FnMut(&Dispatch<'_>) -> Sent) -> Result<Called, OnceError> {
        self.call_while(call, || true, send)
    }

    /// [`Once::call_with`] for a caller that can go away (a client that hangs
    /// up, a process shutting down): at each wait the call goes on only while
    /// `keep_going` says so, else it answers the wait's account at once. After
    /// an attempt that was not sent the engine waits before the next, so a
    /// caller that is gone spends one attempt, never the key's whole budget.
    pub fn call_while(
        &self,
        call: &Call,
        keep_going: impl Fn() -> bool,
        mut send: impl FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Called, OnceError> {
        let step = self.with_instance(|i| i.start(call))??;
        trace_step("start", &call.scope, &call.tool, &step);
        self.drive(step, Some(call), self.wait, &keep_going, &mut send)
    }

    /// Go on with an operation from the ledger (after a crash, or to settle it
    /// in the background): its holder's outcome, a read, or the owed dispatch.
    pub fn resume(&self, scope: &str, key: &str, send: impl FnMut(&Dispatch<'_>) -> Sent) -> Result<Called, OnceError> {
        self.resume_within(scope, key, self.wait, send)
    }

    /// [`Once::resume`], waiting at most `patience` instead of [`Builder::wait_up_to`]
    /// (`Duration::ZERO`: answer what is known now, as a background round does).
    pub fn resume_within(
        &self,
        scope: &str,
        key: &str,
        patience: Duration,
        mut send: impl FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Called, OnceError> {
        let step = self.resume_step(scope, key)?;
        self.drive(step, None, patience, &|| true, &mut send)
    }

    /// Whether a call loop of this handle (`call`, `resume`, `settle`, or their async forms) is going on
    /// with the operation (scope, key) now. A host that resumes operations in the background on its own
    /// (as a gateway's worker resumes what it answered as unsettled) leaves such an operation to that
    /// loop, as [`Once::settle`] does. It is a check, not a claim: a call that begins right after it
    /// can still race the resume that follows (the ledger keeps the effect single either way).
    pub fn is_driven(&self, scope: &str, key: &str) -> bool {
        self.driving.driven(scope, key)
    }

    /// One round of background work for a host that sends: the sweep, then
    /// each owed dispatch granted just before it is sent with `send`, and
    /// reported. (Granting a round's dispatches together let the later ones'
    /// send-by pass while earlier ones were sent: "not sent", an attempt spent.)
    ///
    /// The sweep reads no provider: each due read it lists is resumed here, read with the
    /// [`Provider`], and followed like any call (an absence it proves is then sent).
    ///
    /// An operation a call of this handle is driving now (in another thread) is left to that call,
    /// which goes on with it (reads, sends) and answers as the one that sent it: had the round come
    /// first, the caller would be told its one call was a replay. A call in a send holds it only
    /// until the deadline the engine gave the answer ([`Dispatch::answer_by`]): a send that hangs
    /// past it leaves the operation, its lease over, to the round.
    pub fn settle(&self, limit: u32, mut send: impl FnMut(&Dispatch<'_>) -> Sent) -> Result<Settled, OnceError> {
        let sweep = self.with_instance(|i| i.sweep(limit, false))??;
        let mut sent = Vec::with_capacity(sweep.owed.len());
        for (scope, key) in &sweep.owed {
            // A call of this handle driving it sends it itself ([`crate::driving`]).
            if self.driving.driven(scope, key) {
                continue;
            }
            // Someone else may have taken it since: then the step says so and nothing is sent.
            let step = self.resume_step(scope, key)?;
            if matches!(step, Step::Dispatch(_)) {
                sent.push(self.drive(step, None, Duration::ZERO, &|| true, &mut send)?);
            }
        }
        let mut read = Vec::with_capacity(sweep.reads.len());
        for (scope, key) in &sweep.reads {
            if self.driving.driven(scope, key) {
                continue;
            }
            let step = self.resume_step(scope, key)?;
            let mut dispatched = false;
            let mut counted = |d: &Dispatch<'_>| {
                dispatched = true;
                send(d)
            };
            let called = self.drive(step, None, Duration::ZERO, &|| true, &mut counted)?;
            if dispatched { &mut sent } else { &mut read }.push(called);
        }
        Ok(Settled { sweep, sent, read })
    }

    /// How often a wait asks whether its caller is still there.
    pub(crate) const KEEP_GOING_POLL: Duration = Duration::from_millis(50);

    /// The loop every host runs: send, report, read, sleep, resume, until the
    /// engine says done (or the wait would outlast `patience`).
    fn drive(
        &self,
        mut step: Step,
        call: Option<&Call>,
        patience: Duration,
        keep_going: &dyn Fn() -> bool,
        send: &mut dyn FnMut(&Dispatch<'_>) -> Sent,
    ) -> Result<Called, OnceError> {
        let patience = Patience::new(self.now(), patience);
        let mut reads = ReadsInARow::after(call);
        let mut driver = self.driving.driver();
        loop {
            reads.follow(&step)?;
            driver.follow(&step);
            step = match step {
                Step::Dispatch(grant) => {
                    // This host's clock first: a ledger clock that is a database query then makes
                    // `send_before` early by the query's time, never late.
                    let at = Instant::now();
                    let now = self.now();
                    let dispatch = Dispatch::of(&grant, now, at);
                    // Never send after send-by: the whole timeout must end inside the lease.
                    let sent = if dispatch.too_late(now) {
                        Sent::NotSent
                    } else {
                        driver.held_until(dispatch.answer_by);
                        let sent = send(&dispatch);
                        driver.held_until(None);
                        sent
                    };
                    match self.report(&grant, &sent) {
                        Ok(next) => next,
                        Err(error) => return report_failed(&grant, sent, error),
                    }
                }
                Step::Wait(wait) => {
                    let pause = if keep_going() {
                        patience.pause(&wait, self.now())
                    } else {
                        None
                    };
                    let Some(pause) = pause else {
                        return Ok(Called::Done(wait.meanwhile));
                    };
                    // In slices, so a caller that goes away during a long wait (a back-off of up to
                    // 30 s) is let go soon, and nothing more is granted for it.
                    let wake = Instant::now() + pause;
                    while Instant::now() < wake && keep_going() {
                        std::thread::sleep(
                            wake.saturating_duration_since(Instant::now())
                                .min(Self::KEEP_GOING_POLL),
                        );
                    }
                    if !keep_going() {
                        return Ok(Called::Done(wait.meanwhile));
                    }
                    self.resume_step(&wait.scope, &wait.key)?
                }
                Step::Read(reading) => {
                    let evidence = self.lookup(&reading)?;
                    self.read_back(reads.starting(), &reading, &evidence)?
                }
                Step::Done(account) => return Ok(Called::Done(account)),
                Step::Direct => {
                    let call = direct_call(call)?;
                    let timeout = self.dispatch_timeout(&call.tool);
                    return Ok(Called::Direct(send(&Dispatch::direct(call, timeout))));
                }
            };
        }
    }

    /// A `read` step's read, through the [`Provider`] this `Once` was built with.
    pub(crate) fn lookup(&self, reading: &Reading) -> Result<Evidence, OnceError> {
        if self.reads_only_in_dispatcher {
            return Err(OnceError::Engine(Error::InvalidRequest(format!(
                "{}/{}: this handle reads the provider in its async Dispatcher (Builder::reads_in_dispatcher) \
                 and has no Provider: drive it with call_async, resume_async or settle_async",
                reading.scope, reading.key
            ))));
        }
        Ok(self
            .host
            .provider
            .lookup(&reading.tool, &reading.provider_key, &reading.args))
    }

    /// Go on after a `read` step with what the read found (`call`: the call being started).
    pub(crate) fn read_back(
        &self,
        call: Option<&Call>,
        reading: &Reading,
        evidence: &Evidence,
    ) -> Result<Step, OnceError> {
        let step = self.with_instance(|i| i.read_back(call, reading, evidence))??;
        trace_step("read-back", &reading.scope, &reading.tool, &step);
        Ok(step)
    }

    /// The dispatch timeout of `tool`, for its DIRECT calls.
    pub(crate) fn dispatch_timeout(&self, tool: &str) -> Duration {
        Duration::from_millis(self.policy(tool).dispatch_timeout_ms)
    }

    pub(crate) fn report(&self, grant: &Grant, sent: &Sent) -> Result<Step, OnceError> {
        let outcome = sent.outcome();
        let step = self.with_instance(|i| i.report(&grant.scope, &grant.key, &grant.fence, &outcome))??;
        trace_step("report", &grant.scope, &grant.tool, &step);
        Ok(step)
    }

    pub(crate) fn resume_step(&self, scope: &str, key: &str) -> Result<Step, OnceError> {
        let step = self.with_instance(|i| i.resume(scope, key))??;
        trace_step("resume", scope, "", &step);
        Ok(step)
    }

    /// RFC 8785 canonical form of a JSON text, computed by the component.
    pub fn canonicalize(&self, json: &[u8]) -> Result<String, OnceError> {
        Ok(self.with_instance(|i| i.canonicalize(json))??)
    }

    /// `sha256(JCS({"tool":…,"args":…}))`, computed by the component.
    pub fn fingerprint(&self, tool: &str, args: &str) -> Result<String, OnceError> {
        Ok(self.with_instance(|i| i.fingerprint(tool, args))??)
    }

    /// The ledger's clock.
    pub fn now(&self) -> u64 {
        self.host.clock.now()
    }

    /// The per-call limits of the component.
    pub fn guest_limits(&self) -> GuestLimits {
        self.limits
    }
}

/// How long a call goes on waiting for its outcome: the caller's patience, on the ledger clock (a
/// wait due after it is answered with its account at once) and on this host's.
pub(crate) struct Patience {
    give_up_at: u64,
    until: Instant,
}

impl Patience {
    /// Patience from now (`now` on the ledger clock).
    pub(crate) fn new(now: u64, patience: Duration) -> Patience {
        Patience {
            give_up_at: now.saturating_add(patience.as_millis() as u64),
            until: Instant::now() + patience,
        }
    }

    /// How long to sleep before resuming `wait` (`now` on the ledger clock), or `None` when the
    /// call answers the wait's account now.
    pub(crate) fn pause(&self, wait: &Waiting, now: u64) -> Option<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if wait.next > self.give_up_at || left.is_zero() {
            return None;
        }
        Some(Duration::from_millis(wait.next.saturating_sub(now)).min(left))
    }
}

/// What a call answers when reporting `sent` failed: after a success the effect happened, and an
/// error would make the caller mint a new intent, so it is [`Called::Unreported`]; else the error.
pub(crate) fn report_failed(grant: &Grant, sent: Sent, error: OnceError) -> Result<Called, OnceError> {
    match sent {
        Sent::Success(response) => {
            tracing::warn!(target: "once", scope = grant.scope, key = grant.key, "report failed after a success: {error}");
            Ok(Called::Unreported {
                response,
                error: error.to_string(),
            })
        }
        _ => Err(error),
    }
}

/// The call a `direct` step answers: only a started call can be one.
pub(crate) fn direct_call(call: Option<&Call>) -> Result<&Call, OnceError> {
    call.ok_or_else(|| OnceError::Component("a resumed operation answered direct".to_string()))
}

/// A tool's plan from what the engine configured: its own, or the defaults'.
fn plan_of(configured: &Configured, tool: &str) -> ToolPlan {
    configured
        .tools
        .iter()
        .find(|p| p.tool == tool)
        .cloned()
        .unwrap_or_else(|| ToolPlan {
            tool: tool.to_string(),
            route: configured.defaults.route.unwrap_or(crate::types::Route::Protect),
            blocked: None,
            policy: configured.defaults.clone(),
        })
}

/// A storage failure as the engine reports one (`Error::Storage`).
pub(crate) fn storage_error(e: StorageError) -> OnceError {
    OnceError::Engine(Error::Storage(e.0))
}

/// How many `read` steps in a row a loop follows before it takes the guest for broken: each is
/// answered by the record as it is then, so more than a few in a row means the ledger keeps changing
/// under the read, or the guest and host disagree on what a read is.
const MAX_READS_IN_A_ROW: u32 = 8;

/// What a call loop brings back with a `read` step's evidence ([`Once::drive`], the async loop): the
/// call only while the read answers its `start` (after a report or a wait the guest goes on from the
/// record, as `resume` does), and how many reads came in a row.
pub(crate) struct ReadsInARow<'c> {
    starting: Option<&'c Call>,
    in_a_row: u32,
}

impl<'c> ReadsInARow<'c> {
    /// A loop's reads; `call`: the call whose `start` answered its first step (none for a resume).
    pub(crate) fn after(call: Option<&'c Call>) -> Self {
        ReadsInARow {
            starting: call,
            in_a_row: 0,
        }
    }

    /// Before the loop follows `step`: a step other than `read` ends the start (a grant, a wait)
    /// and the run of reads; one read too many is an error.
    pub(crate) fn follow(&mut self, step: &Step) -> Result<(), OnceError> {
        match step {
            Step::Read(reading) => {
                self.in_a_row += 1;
                // The engine's own word for a record that keeps changing under its decisions: the
                // ledger is busy, nothing is known of the effect, and the same key is safe to try again.
                if self.in_a_row > MAX_READS_IN_A_ROW {
                    return Err(OnceError::Engine(Error::Storage(format!(
                        "{}/{}: the record kept changing under {} provider reads in a row",
                        reading.scope, reading.key, MAX_READS_IN_A_ROW
                    ))));
                }
            }
            _ => {
                self.starting = None;
                self.in_a_row = 0;
            }
        }
        Ok(())
    }

    /// The call to bring back with this read: the one being started, if the read answers its start.
    pub(crate) fn starting(&self) -> Option<&'c Call> {
        self.starting
    }
}

pub(crate) fn trace_step(export: &str, scope: &str, tool: &str, step: &Step) {
    let (step_name, key, attempt) = match step {
        Step::Dispatch(g) => ("dispatch", g.key.as_str(), Some(g.attempt)),
        Step::Read(r) => ("read", r.key.as_str(), None),
        Step::Wait(w) => ("wait", w.key.as_str(), None),
        Step::Done(a) => (a.ending.name(), a.key.as_deref().unwrap_or_default(), None),
        Step::Direct => ("direct", "", None),
    };
    tracing::info!(target: "once", export, scope, key, tool, step = step_name, attempt, "step");
}
