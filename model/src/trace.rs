//! Running a configuration and reading its counterexamples.

use std::fmt::Write;
use std::time::{Duration, Instant};

use stateright::{Checker, Model};

use crate::configs::Config;
use crate::model::{Action, OnceModel, PROPERTIES, broken};

/// What one exhaustive run found.
pub struct Report {
    /// The configuration's name.
    pub name: &'static str,
    /// States generated.
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// Deepest path.
    pub depth: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Each broken property with the shortest trace that breaks it.
    pub counterexamples: Vec<Counterexample>,
}

/// A property and the actions that break it.
pub struct Counterexample {
    /// The property.
    pub property: &'static str,
    /// The actions, in order, from the initial state.
    pub actions: Vec<Action>,
    /// Why the last state breaks it.
    pub why: String,
}

/// Explore every reachable state of `config` breadth first, up to its depth.
pub fn check(config: Config) -> Report {
    run(config, false)
}

/// Explore `config` until the first property breaks (a mutant's run).
pub fn check_until_broken(config: Config) -> Report {
    run(config, true)
}

fn run(config: Config, first: bool) -> Report {
    let name = config.name;
    let started = Instant::now();
    let depth = config.depth;
    let mut builder = OnceModel::new(config).checker().threads(1).target_max_depth(depth);
    if first {
        builder = builder.finish_when(stateright::HasDiscoveries::Any);
    }
    if let Some(n) = std::env::var("ONCE_MODEL_MAX_STATES").ok().and_then(|n| n.parse().ok()) {
        builder = builder.target_state_count(n);
    }
    if let Some(d) = std::env::var("ONCE_MODEL_MAX_DEPTH").ok().and_then(|n| n.parse().ok()) {
        builder = builder.target_max_depth(d);
    }
    let checker = builder.spawn_bfs().join();
    let model = checker.model();
    let mut counterexamples = Vec::new();
    for property in PROPERTIES {
        if let Some(path) = checker.discovery(property) {
            let why = broken(model, path.last_state()).map_or_else(|| "(not reproduced)".to_string(), |b| b.1);
            counterexamples.push(Counterexample {
                property,
                actions: path.into_actions(),
                why,
            });
        }
    }
    Report {
        name,
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed: started.elapsed(),
        counterexamples,
    }
}

/// Replay `actions` from the initial state of `config`: the property the
/// last state breaks (none: it breaks nothing).
pub fn replay(config: Config, actions: &[Action]) -> Option<(&'static str, String)> {
    let model = OnceModel::new(config);
    let mut world = model.initial();
    for action in actions {
        let mut enabled = Vec::new();
        model.enabled(&world, &mut enabled);
        assert!(
            enabled.contains(action),
            "{action:?} is not enabled at this point of the trace"
        );
        // An enabled step may change nothing (a prune with nothing to prune): the world stays.
        world = model.step(&world, action).unwrap_or(world);
    }
    broken(&model, &world)
}

impl Counterexample {
    /// The trace, one action a line, then the property and why.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (n, action) in self.actions.iter().enumerate() {
            let _ = writeln!(out, "  {:>2}. {action:?}", n + 1);
        }
        let _ = writeln!(out, "  broken: {}\n  because: {}", self.property, self.why);
        out
    }
}

impl Report {
    /// One line: the configuration, its state counts and time.
    pub fn summary(&self) -> String {
        format!(
            "{}: {} states ({} distinct), depth {}, {:.1} s, {} counterexample(s)",
            self.name,
            self.states,
            self.unique,
            self.depth,
            self.elapsed.as_secs_f64(),
            self.counterexamples.len()
        )
    }
}
