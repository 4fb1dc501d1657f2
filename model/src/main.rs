//! `once-model [small|deep] [NAME…]`: explore the configurations and print
//! each one's state count, time and counterexamples (exit 1 if any).

use std::process::ExitCode;

use once_model::configs;
use once_model::trace::check;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "small".into());
    let names: Vec<String> = args.collect();
    if which == "mutants" {
        return mutants();
    }
    let configs = match which.as_str() {
        "small" => configs::small(),
        "deep" => configs::deep(),
        other => {
            eprintln!("once-model: unknown set {other:?}; use small, deep or mutants, then configuration names");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for config in configs
        .into_iter()
        .filter(|c| names.is_empty() || names.iter().any(|n| n == c.name))
    {
        let report = check(config);
        println!("{}", report.summary());
        for cx in &report.counterexamples {
            failed = true;
            println!("{}", cx.render());
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// Which small configuration catches each mutant, and with which property.
fn mutants() -> ExitCode {
    let mut missed = false;
    for mutant in once_guest::mutant::Mutant::ALL {
        let caught = configs::small().into_iter().find_map(|mut c| {
            c.mutant = Some(mutant);
            let report = check(c);
            report
                .counterexamples
                .first()
                .map(|cx| (report.name, cx.property, cx.actions.len()))
        });
        match caught {
            Some((config, property, steps)) => println!("{mutant:?}: caught by {config:?} ({property}, {steps} steps)"),
            None => {
                missed = true;
                println!("{mutant:?}: MISSED");
            }
        }
    }
    if missed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
