//! Replay one input of a machine target and print its operations and verdict:
//! `cargo +nightly run --example replay -- machine|machine_truthful FILE`.

use arbitrary::Unstructured;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let data = std::fs::read(&args[2]).expect("reading the input");
    let mut u = Unstructured::new(&data);
    match args[1].as_str() {
        "machine" => {
            let (knobs, ops) = once_fuzz::machine::decode(&mut u).expect("decodable");
            println!("{knobs:?}");
            for op in &ops {
                println!("{op:?}");
            }
            println!("{:?}", once_fuzz::machine::run(knobs, ops));
        }
        "machine_truthful" => {
            let (verify_first, budget, ops) = once_fuzz::truthful::decode(&mut u).expect("decodable");
            println!("verify_first {verify_first} budget {budget}");
            for op in &ops {
                println!("{op:?}");
            }
            println!("{:?}", once_fuzz::truthful::truthful_run(verify_first, budget, ops));
        }
        other => panic!("unknown target {other}"),
    }
}
