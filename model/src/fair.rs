//! Liveness, checked from every state: under a fair schedule (the sink
//! recovers, no more faults, every holder sends and hears back, every read
//! is made and brought back, waiting callers stop waiting, every host sweeps after each time jump)
//! every operation ends confirmed, failed or superseded, or escalated and
//! acknowledged by the sink.
//!
//! stateright's `eventually` only sees acyclic paths; this check instead
//! runs one bounded fair continuation of the real engine from each explored
//! state and asks where it ends.

use once_guest::store::decode;
use once_guest::types::{State, Table};

use crate::host::Read;
use crate::model::{Action, OnceModel, Said};
use crate::world::{Fate, Pos, World};

/// Rounds of the fair schedule before it must have settled.
const ROUNDS: usize = 40;

/// Whether every operation of `world` settles under the fair schedule.
pub fn settles(model: &OnceModel, world: &World) -> Result<(), String> {
    let mut w = world.clone();
    w.sink_up = true;
    w.fault = None;
    w.slow_commit = None;
    w.budget.sweeps = u8::MAX;
    w.budget.ticks = u8::MAX;
    w.budget.crashes = 0;
    for _ in 0..ROUNDS {
        let before = w.clone();
        w = stop_waiting(model, w);
        if unsettled(&w).is_none() && w.agents.iter().all(|a| a.pos == Pos::Idle) {
            return Ok(());
        }
        // Every holder sends if it still may, the provider commits, the holder hears back.
        let mut i = 0;
        while i < w.agents.len() {
            w = advance(model, w, i);
            i += 1;
        }
        for host in 0..model.config.hosts.len() {
            w = apply(model, w, Action::Sweep(host, Read::Now));
        }
        let quiet = w
            .agents
            .iter()
            .all(|a| !matches!(a.pos, Pos::Holding(_) | Pos::Reading { .. }));
        if quiet && (unsettled(&w).is_some() || w.agents.iter().any(|a| a.pos != Pos::Idle)) {
            match model.next_threshold(&w) {
                Some(_) => w = apply(model, w, Action::Tick),
                // Nothing to wait for, but this round changed something (a sweep's owed grant
                // that asked a person again is due at once): the next round's sweep takes it.
                None if w != before => {}
                None => break,
            }
        }
        // A broken rule on the way is reported here: the continuation's states lie beyond the
        // explored graph, so no other property sees them.
        if let Some(why) = &w.violation {
            return Err(format!("on the fair schedule: {why}"));
        }
    }
    for agent in w.agents.iter_mut() {
        if matches!(agent.pos, Pos::Waiting { .. }) {
            agent.pos = Pos::Idle;
        }
    }
    w.agents.retain(|a| a.op.is_some() || a.pos != Pos::Idle);
    match unsettled(&w) {
        None if w.agents.iter().all(|a| a.pos == Pos::Idle) => Ok(()),
        None => Err("a caller is still waiting after the fair schedule".into()),
        Some(why) => Err(why),
    }
}

/// Every read asked for is made and brought back; then a waiting caller stops waiting (it may at
/// any time: the background work must settle the operation).
fn stop_waiting(model: &OnceModel, mut w: World) -> World {
    let mut i = 0;
    while i < w.agents.len() {
        w = read(model, w, i);
        i += 1;
    }
    for agent in w.agents.iter_mut() {
        if matches!(agent.pos, Pos::Waiting { .. }) {
            agent.pos = Pos::Idle;
        }
    }
    w.agents.retain(|a| a.op.is_some() || a.pos != Pos::Idle);
    w
}

/// Agent `i`'s read, if it was asked for one, made at once and brought back (a few times, if the
/// record moved on meanwhile).
fn read(model: &OnceModel, mut w: World, i: usize) -> World {
    for _ in 0..4 {
        match w.agents.get(i).map(|a| &a.pos) {
            Some(Pos::Reading { found: None, .. }) => w = apply(model, w, Action::Read(i, Read::Now)),
            Some(Pos::Reading { found: Some(_), .. }) => w = apply(model, w, Action::ReadBack(i)),
            _ => break,
        }
    }
    w
}

fn apply(model: &OnceModel, w: World, action: Action) -> World {
    model.step(&w, &action).unwrap_or(w)
}

/// One agent's fair move.
fn advance(model: &OnceModel, mut w: World, i: usize) -> World {
    w = read(model, w, i);
    let Some(agent) = w.agents.get(i).cloned() else {
        return w;
    };
    match agent.pos {
        Pos::Holding(held) => {
            let clock = model.clock(&w, agent.host);
            if held.sent.is_none() && clock <= held.send_by {
                w = apply(model, w, Action::Send(i));
            }
            let Pos::Holding(held) = w.agents[i].pos.clone() else {
                return w;
            };
            let said = match held.sent {
                None => Said::NotSent,
                Some(r) => {
                    if w.requests[r].fate == Fate::Pending {
                        w = apply(model, w, Action::Commit(r));
                    }
                    match &w.requests[r].fate {
                        Fate::Effect { receipt, .. } | Fate::Deduped { receipt } => Said::Success(receipt.clone()),
                        Fate::Refused => Said::Rejected,
                        Fate::Pending | Fate::Dropped => Said::Ambiguous,
                    }
                }
            };
            apply(model, w, Action::Report(i, said))
        }
        _ => w,
    }
}

/// The first operation that has not settled, and where it stands.
fn unsettled(w: &World) -> Option<String> {
    for row in w.ledger.rows.values().filter(|r| r.table == Table::Operation) {
        let Ok(loaded) = decode(row) else {
            return Some(format!("{}/{} does not decode", row.scope, row.key));
        };
        let rec = loaded.rec;
        let settled = match rec.state {
            State::Confirmed | State::Failed | State::Superseded | State::Denied => true,
            // Waiting for a person is settled once a person has been told.
            State::Unknown | State::Absent | State::AwaitingApproval => rec.escalated && rec.escalation_acked,
            State::InFlight => false,
        };
        if !settled {
            return Some(format!(
                "{}/{} is still {:?} (owner {:?}, escalated {}, acknowledged {}) after a fair schedule",
                rec.scope, rec.key, rec.state, rec.owner, rec.escalated, rec.escalation_acked
            ));
        }
    }
    None
}
