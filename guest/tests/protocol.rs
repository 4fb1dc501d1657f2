//! The call protocol natively: every step kind, and the facts of every
//! account, from the engine's own decisions. A host loop only sends, sleeps
//! and reports; these tests are that loop, one step at a time.

mod common;

use common::*;
use once_guest::config::{Config, default_settings};
use once_guest::host::{CommitError, Host};
use once_guest::policy::unset;
use once_guest::protocol::{report, resume, start, start_request, sweep};
use once_guest::testing::MemoryHost;
use once_guest::types::{
    BlockReason, Call, Configuration, Confirmation, Effect, Ending, Error, Evidence, Grant, IdentityMode, KeySource,
    LedgerEncoding, Outcome, PolicyInput, ProviderReads, QuotaInput, Repeat, ReplayVia, Route, State, Step, ToolConfig,
    WaitReason,
};

fn call(key: &str) -> once_guest::engine::BeginRequest {
    refund(key, ARGS)
}

fn sent(h: &impl Host, g: &Grant, outcome: Outcome) -> Step {
    report(h, &g.scope, &g.key, &g.fence, outcome).expect("report answers a step")
}

// ---------------------------------------------------------------- dispatch, then done

#[test]
fn a_grant_reported_success_is_done_confirmed_and_a_repeat_replays() {
    let h = MemoryHost::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    assert_eq!((g.attempt, g.tool.as_str(), g.timeout_ms), (1, "refund", 30_000));
    assert_eq!(g.send_by, g.lease_until - 30_000);
    let a = done(sent(&h, &g, success(RECEIPT)));
    assert_eq!((a.effect, a.repeat), (Effect::Happened, Repeat::Replays));
    assert_eq!(
        (a.key.as_deref(), a.key_source),
        (Some("k"), Some(KeySource::Application))
    );
    let Ending::Confirmed(c) = a.ending else {
        panic!("{a:?}")
    };
    assert_eq!((c.receipt.as_str(), c.replayed, c.via), (RECEIPT, false, None));
    assert_eq!(
        (c.confirmed_by, c.attempt, c.earlier_attempts),
        (Confirmation::Answer, Some(1), Effect::None)
    );

    let again = done(start_request(&h, call("k")).unwrap());
    let Ending::Confirmed(c) = again.ending else {
        panic!("{again:?}")
    };
    assert_eq!(
        (c.receipt.as_str(), c.replayed, c.via),
        (RECEIPT, true, Some(ReplayVia::Key))
    );
    assert_eq!(view(&h, "k").attempts, 1);
}

/// Nothing sent: the next attempt of the same call comes after a back-off
/// (the reconcile interval, doubled for each not-sent attempt in a row), not
/// at once: b58a043's hung-up client and down upstream spent all three
/// attempts within ~200 ms. Each grant still counts against the budget.
#[test]
fn not_sent_backs_off_before_the_next_grant_and_a_spent_budget_is_not_sent() {
    let h = MemoryHost::new();
    let interval = once_guest::policy::default_policy().reconcile_interval_ms;
    let g1 = dispatch(start_request(&h, call("k")).unwrap());
    let w = wait(sent(&h, &g1, Outcome::NotSent));
    assert_eq!(
        (w.reason, w.next, w.until),
        (WaitReason::Retry, h.now() + interval, h.now() + interval)
    );
    let Ending::NotSent(ref n) = w.meanwhile.ending else {
        panic!("{w:?}")
    };
    assert_eq!(n.attempts, 1);
    assert_eq!(
        (w.meanwhile.effect, w.meanwhile.repeat),
        (Effect::None, Repeat::Retries)
    );
    // Asking early gets the same wait, and no attempt is spent.
    h.advance(interval - 1);
    assert_eq!(wait(resume(&h, "s", "k").unwrap()).next, w.next);
    assert_eq!(view(&h, "k").attempts, 1);
    h.advance(1);
    let g2 = dispatch(resume(&h, "s", "k").unwrap());
    assert_eq!((g2.attempt, g2.provider_key.as_str()), (2, g1.provider_key.as_str()));
    let a = done(sent(&h, &g2, success(RECEIPT)));
    let Ending::Confirmed(c) = a.ending else {
        panic!("{a:?}")
    };
    assert_eq!((c.attempt, c.earlier_attempts), (Some(2), Effect::None));

    // The back-off doubles; the third not-sent attempt spends the budget: done, not sent.
    let mut step = start_request(&h, call("n")).unwrap();
    let mut waits = Vec::new();
    for _ in 0..2 {
        let w = wait(sent(&h, &dispatch(step), Outcome::NotSent));
        waits.push(w.next - h.now());
        h.advance(w.next - h.now());
        step = resume(&h, "s", "n").unwrap();
    }
    assert_eq!(waits, [interval, 2 * interval]);
    let a = done(sent(&h, &dispatch(step), Outcome::NotSent));
    assert!(matches!(a.ending, Ending::NotSent(ref n) if n.attempts == 3), "{a:?}");
    assert_eq!((a.effect, a.repeat), (Effect::None, Repeat::Refused));
}

/// A new call on a key whose last attempt was not sent is its caller's own
/// decision to try: it is granted at once (a hung-up client's retry).
#[test]
fn a_new_call_after_a_not_sent_attempt_is_granted_at_once() {
    let h = MemoryHost::new();
    let g1 = dispatch(start_request(&h, call("k")).unwrap());
    wait(sent(&h, &g1, Outcome::NotSent));
    let g2 = dispatch(start_request(&h, call("k")).unwrap());
    assert_eq!(g2.attempt, 2);
}

/// A function that returned has happened (DESIGN.md "Every answer is true"):
/// a response that is not JSON is still its receipt, stored verbatim and
/// flagged (b58a043 answered unrecorded and left the record in flight).
#[test]
fn a_success_whose_response_is_not_json_is_confirmed_with_it_whole() {
    let h = MemoryHost::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    let a = done(sent(&h, &g, success("refunded, id r_1")));
    let Ending::Confirmed(c) = a.ending else {
        panic!("{a:?}")
    };
    assert_eq!((c.receipt.as_str(), c.replayed), ("refunded, id r_1", false));
    assert_eq!((a.effect, a.repeat), (Effect::Happened, Repeat::Replays));
    let v = view(&h, "k");
    assert_eq!(v.state, State::Confirmed);
    // Kept whole inside a JSON stand-in: every host parses a replayed receipt.
    let stored: serde_json::Value = serde_json::from_str(v.receipt.as_deref().unwrap()).unwrap();
    assert_eq!(stored["once_unparsed_receipt"]["text"], "refunded, id r_1");
    assert!(body(&v)["receipt_flaw"].is_object());
}

#[test]
fn a_lost_reply_is_read_at_once_and_a_found_effect_is_done() {
    let h = MemoryHost::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    let a = done(sent(&h, &g, Outcome::Ambiguous("connection reset".into())));
    assert_eq!(h.lookups().len(), 1);
    let Ending::Confirmed(c) = a.ending else {
        panic!("{a:?}")
    };
    assert_eq!(
        (c.confirmed_by, c.via, c.replayed),
        (Confirmation::Provider, Some(ReplayVia::Provider), true)
    );
}

#[test]
fn a_lost_reply_waits_out_max_in_flight_then_the_owed_dispatch_is_granted() {
    let h = MemoryHost::new();
    let g1 = dispatch(start_request(&h, call("k")).unwrap());
    h.advance(SECOND);
    // Read at once: the answer cannot be later than the dispatch it must follow.
    h.script_lookup(Evidence::Absent(h.now()));
    let w = wait(sent(&h, &g1, Outcome::Ambiguous("timeout".into())));
    assert_eq!((w.reason, w.until), (WaitReason::Reconciliation, h.now() + SECOND));
    let Ending::Unknown(u) = &w.meanwhile.ending else {
        panic!("{w:?}")
    };
    assert_eq!((u.reason.as_str(), u.next_read), ("timeout", Some(w.until)));
    assert_eq!(
        (w.meanwhile.effect, w.meanwhile.repeat),
        (Effect::Unknown, Repeat::Waits)
    );

    // Absent now, but an earlier request may still commit until the last dispatch plus max_in_flight.
    h.advance(w.until - h.now());
    h.script_lookup(Evidence::Absent(h.now()));
    let w = wait(resume(&h, "s", "k").unwrap());
    assert_eq!(
        (w.reason, w.until),
        (WaitReason::Reconciliation, T0 + SECOND + MAX_IN_FLIGHT + 1)
    );

    h.advance(w.until - h.now());
    h.script_lookup(Evidence::Absent(h.now()));
    let g2 = dispatch(resume(&h, "s", "k").unwrap());
    assert_eq!((g2.attempt, g2.provider_key.as_str()), (2, g1.provider_key.as_str()));
    assert_eq!(h.lookups().len(), 3);
}

#[test]
fn resuming_before_a_read_is_due_reads_nothing_and_keeps_the_backoff() {
    let h = MemoryHost::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    h.script_lookup(Evidence::Unknown("provider down".into()));
    let w = wait(sent(&h, &g, Outcome::Ambiguous("timeout".into())));
    assert_eq!(h.lookups().len(), 1, "a lost reply is read at once");
    // Asked again and again before the next read: the same wait, no read.
    for _ in 0..3 {
        h.advance(1);
        let again = wait(resume(&h, "s", "k").unwrap());
        assert_eq!((again.next, again.reason), (w.next, WaitReason::Reconciliation));
    }
    assert_eq!(h.lookups().len(), 1, "resume read before the read was due");
    h.advance(w.next - h.now());
    h.script_lookup(Evidence::Confirmed(RECEIPT.to_string()));
    assert!(matches!(
        done(resume(&h, "s", "k").unwrap()).ending,
        Ending::Confirmed(_)
    ));
    assert_eq!(h.lookups().len(), 2);
}

#[test]
fn a_call_behind_a_live_holder_waits_for_its_outcome() {
    let h = MemoryHost::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    let w = wait(start_request(&h, call("k")).unwrap());
    assert_eq!((w.reason, w.until), (WaitReason::Holder, g.lease_until));
    assert!(matches!(w.meanwhile.ending, Ending::InFlight(ref i) if i.lease_until == g.lease_until));
    // Still held: wait again.
    assert_eq!(wait(resume(&h, "s", "k").unwrap()).reason, WaitReason::Holder);
    done(sent(&h, &g, success(RECEIPT)));
    let a = done(resume(&h, "s", "k").unwrap());
    assert!(matches!(a.ending, Ending::Confirmed(ref c) if c.replayed && c.receipt == RECEIPT));
    assert_eq!(view(&h, "k").attempts, 1, "the waiter sent nothing");
}

#[test]
fn a_rejection_is_done_and_says_the_same_call_retries_while_attempts_are_left() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.attempt_budget = 2;
    let g = dispatch(start_request(&h, with_policy(call("k"), p.clone())).unwrap());
    let a = done(sent(&h, &g, rejected()));
    assert!(matches!(a.ending, Ending::Rejected(ref r) if r.attempt == 1));
    assert_eq!((a.effect, a.repeat), (Effect::None, Repeat::Retries));
    let g2 = dispatch(start_request(&h, with_policy(call("k"), p)).unwrap());
    let a = done(sent(&h, &g2, rejected()));
    assert_eq!(a.repeat, Repeat::Refused, "no attempt left");
}

#[test]
fn a_rejection_after_the_record_moved_on_is_not_reported_as_rejected() {
    let h = MemoryHost::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    h.advance(LEASE);
    assert_eq!(once_guest::engine::sweep(&h, 10).unwrap().expired, 1);
    let step = sent(&h, &g, rejected());
    let account = match step {
        Step::Done(a) => a,
        Step::Wait(w) => w.meanwhile,
        other => panic!("{other:?}"),
    };
    assert!(matches!(account.ending, Ending::Unknown(_)), "{account:?}");
    assert_eq!(view(&h, "k").state, State::Unknown);
}

/// A memory host that logs every import call the engine makes through it,
/// and whose commits fail while `failing` is set.
#[derive(Default)]
struct Observed {
    host: MemoryHost,
    failing: std::cell::Cell<bool>,
    calls: std::cell::RefCell<Vec<&'static str>>,
    /// `deferrable` of every batch committed, in order.
    deferred: std::cell::RefCell<Vec<bool>>,
    /// How long the next commit that applies takes, on the ledger's clock (a loaded ledger).
    slow_commit: std::cell::Cell<Option<u64>>,
    /// Whether the commit after that slow one fails (the store went away).
    fail_after_slow: std::cell::Cell<bool>,
    /// How many applied commits pass before the slow one.
    commits_before_slow: std::cell::Cell<u32>,
}

impl Observed {
    /// An instance past its first call: it holds the ledger's provider-key secret.
    fn new() -> Observed {
        let observed = Observed::fresh();
        once_guest::secret::key_secret(&observed.host).expect("the ledger has its secret");
        observed
    }

    /// An instance that has not read the ledger's provider-key secret yet.
    fn fresh() -> Observed {
        Observed {
            host: MemoryHost::new(),
            ..Observed::default()
        }
    }

    /// The import calls since the last `take`.
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut self.calls.borrow_mut())
    }

    fn log(&self, call: &'static str) {
        self.calls.borrow_mut().push(call);
    }
}

impl Host for Observed {
    fn now(&self) -> u64 {
        self.log("now");
        self.host.now()
    }
    fn settings(&self) -> once_guest::types::Settings {
        // Configured once per instance: not an import.
        self.host.settings()
    }
    fn get(&self, t: once_guest::types::Table, s: &str, k: &str) -> Result<Option<once_guest::types::Stored>, String> {
        self.log("get");
        self.host.get(t, s, k)
    }
    fn commit(&self, b: &once_guest::types::Batch) -> Result<(), CommitError> {
        self.log("commit");
        self.deferred.borrow_mut().push(b.deferrable);
        if self.failing.get() {
            return Err(CommitError::Storage("disk full".into()));
        }
        self.host.commit(b)?;
        if self.commits_before_slow.get() > 0 {
            self.commits_before_slow.set(self.commits_before_slow.get() - 1);
        } else if let Some(took) = self.slow_commit.take() {
            self.host.advance(took);
            if self.fail_after_slow.take() {
                self.failing.set(true);
            }
        }
        Ok(())
    }
    fn scan(
        &self,
        t: once_guest::types::Table,
        st: &[State],
        d: u64,
        o: Option<String>,
        l: u32,
    ) -> Result<Vec<once_guest::types::Row>, String> {
        self.log("scan");
        self.host.scan(t, st, d, o, l)
    }
    fn audit(&self, s: &str, k: &str) -> Result<Vec<once_guest::types::AuditEvent>, String> {
        self.log("audit");
        self.host.audit(s, k)
    }
    fn lookup(&self, t: &str, p: &str, a: &str) -> Evidence {
        self.log("lookup");
        self.host.lookup(t, p, a)
    }
    fn escalate(&self, e: &once_guest::types::Escalation) -> bool {
        self.log("escalate");
        self.host.escalate(e)
    }
    fn entropy(&self, len: u32) -> Vec<u8> {
        self.host.entropy(len)
    }
    fn secret_cache(&self) -> Option<&once_guest::secret::SecretCache> {
        self.host.secret_cache()
    }
    fn witnessed(&self, s: &str, k: &str) -> Result<Option<String>, String> {
        self.log("seen");
        self.host.witnessed(s, k)
    }
    fn keep_witness(&self, s: &str, k: &str, b: &str, at: u64) -> Result<(), String> {
        self.log("keep");
        self.host.keep_witness(s, k, b, at)
    }
    fn forget_witnessed(&self, s: &str, k: &str, before: u64) -> Result<(), String> {
        self.log("forget");
        self.host.forget_witnessed(s, k, before)
    }
}

/// A grant whose commit took its send window (a ledger where the write queued behind others) has
/// its lease renewed before it is handed out: the host gets the whole window to start sending. At
/// 1197540 the grant came out with `send-by` already past; the host reported "not sent", and three
/// such grants answered NOT SENT with the key's budget spent, though nothing was wrong.
#[test]
fn a_grant_whose_commit_took_its_send_window_is_renewed_before_it_is_handed_out() {
    let h = Observed::new();
    let g = dispatch(start_request(&h, call("quick")).unwrap());
    let window = g.send_by - h.host.now();
    // The first attempt: the claim's commit took the whole window.
    h.slow_commit.set(Some(window));
    let g = dispatch(start_request(&h, call("slow")).unwrap());
    assert_eq!(g.send_by - h.host.now(), window, "the whole window from now: {g:?}");
    assert_eq!(g.attempt, 1);
    done(sent(&h, &g, Outcome::Rejected("declined".into())));
    // A later attempt (the grant from failed): the same.
    h.slow_commit.set(Some(window));
    let g = dispatch(start_request(&h, call("slow")).unwrap());
    assert_eq!((g.attempt, g.send_by - h.host.now()), (2, window), "{g:?}");
    let a = done(sent(&h, &g, success(RECEIPT)));
    assert!(matches!(a.ending, Ending::Confirmed(_)), "{a:?}");
    let v = view(&h.host, "slow");
    assert_eq!(
        kinds(&v),
        [
            "begin",
            "lease-renewed",
            "finish-rejected",
            "retry",
            "lease-renewed",
            "finish-success"
        ]
    );
    // A commit that took a quarter of the window or less is handed out as committed.
    h.slow_commit.set(Some(window / 4));
    let g = dispatch(start_request(&h, call("brisk")).unwrap());
    assert_eq!(g.send_by - h.host.now(), window - window / 4);
    assert_eq!(kinds(&view(&h.host, "brisk")), ["begin"]);
    // A renewal that cannot be written is no error: the grant comes out as committed (its host
    // finds send-by past and says not sent), and the record is as the grant left it.
    h.slow_commit.set(Some(window));
    h.fail_after_slow.set(true);
    let g = dispatch(start_request(&h, call("unrenewed")).unwrap());
    h.failing.set(false);
    assert_eq!(g.send_by, h.host.now(), "{g:?}");
    assert_eq!(kinds(&view(&h.host, "unrenewed")), ["begin"]);
    wait(sent(&h, &g, Outcome::NotSent));
}

/// A read that could not yet prove absence sets the next read after `max_in_flight`. When writing
/// that down took as long (a loaded host), the next read is due before the step ends: the caller is
/// told to resume at once, and its resume reads and sends the owed dispatch. At c3da229 the call
/// was done "unknown" instead and stopped (the JS study's never-retry agent omitted its refund
/// under load in CI).
#[test]
fn a_read_due_before_its_step_ends_is_a_wait_to_resume_at_once() {
    let h = Observed::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    let max_in_flight = once_guest::policy::default_policy().max_in_flight_ms;
    h.host.script_lookup(Evidence::Absent(h.host.now()));
    // The report's first commit records the lost reply; its second, the inconclusive read, is slow.
    h.commits_before_slow.set(1);
    h.slow_commit.set(Some(2 * max_in_flight));
    let w = wait(sent(&h, &g, ambiguous()));
    assert_eq!((w.reason, w.next), (WaitReason::Reconciliation, h.host.now()), "{w:?}");
    assert!(matches!(w.meanwhile.ending, Ending::Unknown(_)), "{w:?}");
    h.host.script_lookup(Evidence::Absent(h.host.now()));
    let g2 = dispatch(resume(&h, "s", "k").unwrap());
    assert_eq!(g2.attempt, 2);
}

#[test]
fn an_outcome_the_ledger_cannot_record_is_told_as_what_the_record_says() {
    let h = Observed::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    h.failing.set(true);
    let w = wait(report(&h, "s", "k", &g.fence, rejected()).unwrap());
    assert_eq!((w.reason, w.until), (WaitReason::Holder, g.lease_until));
    assert!(matches!(w.meanwhile.ending, Ending::InFlight(_)));
    // A success that cannot be recorded did happen: never an error, never a new intent.
    let g2 = {
        h.failing.set(false);
        dispatch(start_request(&h, call("j")).unwrap())
    };
    h.failing.set(true);
    let a = done(report(&h, "s", "j", &g2.fence, success(RECEIPT)).unwrap());
    assert!(matches!(a.ending, Ending::Unrecorded(ref u) if u.response == RECEIPT));
    assert_eq!((a.effect, a.repeat), (Effect::Happened, Repeat::Waits));
}

#[test]
fn a_tool_without_a_lookup_is_never_read_and_says_an_operator_settles_it() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.lookup = false;
    let g = dispatch(start_request(&h, with_policy(call("k"), p)).unwrap());
    let a = done(sent(&h, &g, Outcome::Ambiguous("timeout".into())));
    assert!(
        matches!(a.ending, Ending::Unknown(ref u) if u.next_read.is_none()),
        "{a:?}"
    );
    assert!(h.lookups().is_empty());
    assert_eq!(once_guest::engine::sweep(&h, 10).unwrap().reconciled, 0);
}

#[test]
fn a_direct_tool_is_sent_as_it_came() {
    let h = MemoryHost::new();
    let mut p = policy();
    p.route = Some(Route::Direct);
    assert_eq!(start_request(&h, with_policy(call("r"), p)).unwrap(), Step::Direct);
    assert_nothing_written(&h);
}

#[test]
fn refusals_are_done_with_facts() {
    let h = MemoryHost::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    done(sent(&h, &g, success(RECEIPT)));
    let a = done(start_request(&h, refund("k", r#"{"order":1,"amount":1}"#)).unwrap());
    assert!(matches!(a.ending, Ending::Conflict(ref c) if c.key == "k"));
    assert_eq!((a.effect, a.repeat), (Effect::None, Repeat::Refused));
    let mut p = policy();
    p.identity = IdentityMode::Required;
    let a = done(start_request(&h, with_policy(req("s", None, "refund", ARGS, policy()), p)).unwrap());
    assert!(matches!(a.ending, Ending::Blocked(ref b) if b.reason == BlockReason::IdentityRequired));
    assert_eq!((a.key, a.effect), (None, Effect::None));
}

// ---------------------------------------------------------------- sweep

#[test]
fn a_dispatching_sweep_grants_every_owed_dispatch_and_an_operators_only_lists_them() {
    let h = MemoryHost::new();
    dispatch(start_request(&h, call("a")).unwrap());
    dispatch(start_request(&h, call("b")).unwrap());
    h.advance(LEASE + MAX_IN_FLIGHT + 10);
    h.script_lookup(Evidence::Absent(h.now()));
    h.script_lookup(Evidence::Absent(h.now()));
    let listed = sweep(&h, 10, false).unwrap();
    assert_eq!(listed.owed.len(), 2);
    assert!(listed.dispatches.is_empty());
    assert_eq!(view(&h, "a").state, State::Absent, "listing spends no attempt");
    let granted = sweep(&h, 10, true).unwrap();
    assert!(granted.owed.is_empty());
    assert_eq!(granted.dispatches.len(), 2);
    for g in &granted.dispatches {
        assert_eq!(g.attempt, 2);
        done(sent(&h, g, success(RECEIPT)));
    }
}

// ---------------------------------------------------------------- configure

fn configuration(tools: Vec<ToolConfig>) -> Configuration {
    Configuration {
        settings: default_settings(),
        defaults: unset(),
        tools,
        ledger_encoding: LedgerEncoding::Typed,
        reads: ProviderReads::Import,
    }
}

fn tool(name: &str, policy: PolicyInput) -> ToolConfig {
    ToolConfig {
        tool: name.into(),
        policy,
        descriptor: None,
    }
}

#[test]
fn configure_fills_what_is_unset_from_the_defaults_then_the_engine() {
    let mut defaults = unset();
    defaults.attempt_budget = Some(5);
    defaults.dispatch_timeout_ms = Some(6_000);
    let mut own = unset();
    own.dispatch_timeout_ms = Some(2_000);
    own.retention_ms = Some(100 * DAY);
    own.quota = Some(QuotaInput {
        spend_field: "/amount".into(),
        ceiling: "500.00".into(),
        decimals: None,
        window_ms: DAY,
        bucket: None,
    });
    let mut c = configuration(vec![tool("refund", own)]);
    c.defaults = defaults;
    c.settings.clock_skew_ms = 50;
    let (config, configured) = Config::new(c).unwrap();
    let p = &configured.tools[0].policy;
    assert_eq!(configured.tools[0].route, Route::Protect);
    assert_eq!(p.attempt_budget, 5, "from the defaults");
    // The lease covers the timeout, a sixth of it (at least 200 ms), and twice the skew.
    assert_eq!((p.dispatch_timeout_ms, p.lease_ms), (2_000, 2_000 + 333 + 100));
    assert_eq!(p.tombstone_retention_ms, 100 * DAY, "at least the retention");
    let q = p.quota.as_ref().unwrap();
    assert_eq!((q.decimals, q.bucket.as_str()), (2, "refund"));
    assert_eq!(p.identity, IdentityMode::Derived);
    // A tool nobody configured gets the defaults.
    assert_eq!(configured.defaults.dispatch_timeout_ms, 6_000);
    assert_eq!(config.policy("other").attempt_budget, 5);
}

#[test]
fn an_inconsistent_configuration_is_refused_naming_the_tool_and_field() {
    let mut lease = unset();
    lease.dispatch_timeout_ms = Some(10_000);
    lease.lease_ms = Some(5_000);
    let e = Config::new(configuration(vec![tool("refund", lease)])).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidPolicy(m) if m.starts_with("tool refund: lease_ms 5000")),
        "{e:?}"
    );

    let mut tomb = unset();
    tomb.retention_ms = Some(10 * DAY);
    tomb.tombstone_retention_ms = Some(DAY);
    let e = Config::new(configuration(vec![tool("refund", tomb)])).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidPolicy(m) if m.contains("tombstone_retention_ms")),
        "{e:?}"
    );

    let quota = |decimals| {
        let mut p = unset();
        p.quota = Some(QuotaInput {
            spend_field: "/amount".into(),
            ceiling: "500".into(),
            decimals: Some(decimals),
            window_ms: DAY,
            bucket: Some("money".into()),
        });
        p
    };
    let e = Config::new(configuration(vec![tool("payout", quota(0)), tool("refund", quota(2))])).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidPolicy(m) if m.contains("a bucket has one unit")),
        "{e:?}"
    );

    let mut settings = configuration(vec![]);
    settings.settings.owner = String::new();
    assert!(matches!(Config::new(settings), Err(Error::InvalidPolicy(_))));

    // A field that belongs to one tool is refused in the defaults, never dropped.
    let mut routed = configuration(vec![]);
    routed.defaults.route = Some(Route::Direct);
    let e = Config::new(routed).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidPolicy(m) if m.starts_with("defaults: route belongs to one tool")),
        "{e:?}"
    );
}

#[test]
fn start_uses_the_configured_policy_of_the_call_s_tool() {
    let h = MemoryHost::new();
    let mut own = unset();
    own.dispatch_timeout_ms = Some(1_000);
    own.identity = Some(IdentityMode::Required);
    let (config, _) = Config::new(configuration(vec![tool("refund", own)])).unwrap();
    let call = |key: Option<&str>| Call {
        scope: "s".into(),
        keys: key.map(|k| vec![("app".into(), k.into())]).unwrap_or_default(),
        tool: "refund".into(),
        args: ARGS.into(),
        supersedes: None,
        acknowledge_confirmed: false,
    };
    let g = dispatch(start(&h, &config, call(Some("k"))).unwrap());
    assert_eq!(g.timeout_ms, 1_000);
    let a = done(start(&h, &config, call(None)).unwrap());
    assert!(matches!(a.ending, Ending::Blocked(ref b) if b.reason == BlockReason::IdentityRequired));
}

/// The crossings of one protected call that succeeds, as docs/contract.md states them:
/// two export calls and eight import calls. A new key is claimed without a ledger read (the
/// witness is asked first, and keeps the grant before it leaves); the grant's `now` after its
/// commit asks whether the commit took its send window.
#[test]
fn a_protected_call_crosses_few_times() {
    let h = Observed::new();
    let g = dispatch(start_request(&h, call("k")).unwrap());
    assert_eq!(h.take(), ["seen", "now", "commit", "now", "keep"], "start");
    done(report(&h, "s", "k", &g.fence, success(RECEIPT)).unwrap());
    assert_eq!(h.take(), ["get", "now", "commit"], "report");
    done(start_request(&h, call("k")).unwrap());
    assert_eq!(
        h.take(),
        ["seen", "get", "now", "commit"],
        "a replay: the witness holds the key, so no blind claim; the record is read (its count is audited)"
    );
}

/// The first call of an instance reads the ledger's provider-key secret once
/// (one `get`); later calls take it from the instance's memory.
#[test]
fn the_secret_costs_one_read_per_instance() {
    let h = Observed::fresh();
    dispatch(start_request(&h, call("k")).unwrap());
    assert_eq!(
        h.take(),
        ["get", "seen", "now", "commit", "now", "keep"],
        "the first call"
    );
    dispatch(start_request(&h, call("k2")).unwrap());
    assert_eq!(h.take(), ["seen", "now", "commit", "now", "keep"], "the next");
}

/// Which batches may wait for the disk (DESIGN.md "Durability budget"): an
/// attempt's own success and a replay's count; never an intent, a rejection,
/// a lost reply, or a late success that settles an unknown record.
#[test]
fn only_an_own_success_and_observations_are_deferrable() {
    let h = Observed::new();
    let deferred = || std::mem::take(&mut *h.deferred.borrow_mut());
    let g = dispatch(start_request(&h, call("k")).unwrap());
    assert_eq!(deferred(), [false], "the intent");
    done(report(&h, "s", "k", &g.fence, success(RECEIPT)).unwrap());
    assert_eq!(deferred(), [true], "the attempt's own success");
    done(start_request(&h, call("k")).unwrap());
    // The witness holds the key, so it is read before any claim; the count is deferrable.
    assert_eq!(deferred(), [true], "a replay");

    let g = dispatch(start_request(&h, call("r")).unwrap());
    deferred();
    done(report(&h, "s", "r", &g.fence, Outcome::Rejected("{\"declined\":true}".into())).unwrap());
    assert_eq!(deferred(), [false], "a rejection");

    let g = dispatch(start_request(&h, call("u")).unwrap());
    deferred();
    let _ = report(&h, "s", "u", &g.fence, Outcome::Ambiguous("reset".into())).unwrap();
    assert!(deferred().iter().all(|d| !d), "a lost reply");
    let _ = report(&h, "s", "u", &g.fence, success(RECEIPT)).unwrap();
    let late = deferred();
    assert!(!late.is_empty() && late.iter().all(|d| !d), "a late success: {late:?}");
}
