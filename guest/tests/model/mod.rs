//! The record machine's model and invariants, shared by the property tests
//! (`proptest_machine.rs`) and the fuzz targets (`fuzz/`, which includes this
//! directory by path): one host, one model, one set of invariants, whatever
//! generates the operations. Failures are plain `Err(String)` so that each
//! driver reports them its own way.
#![allow(dead_code)]

/// `prop_assert!` for plain `Result<_, String>` functions.
macro_rules! ensure {
    ($cond:expr) => {
        if !$cond {
            return Err(format!("assertion failed: {}", stringify!($cond)));
        }
    };
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// `prop_assert_eq!` for plain `Result<_, String>` functions.
macro_rules! ensure_eq {
    ($a:expr, $b:expr) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{} != {}: {:?} != {:?}", stringify!($a), stringify!($b), a, b));
        }
    }};
    ($a:expr, $b:expr, $($fmt:tt)+) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(format!("{:?} != {:?}: {}", a, b, format!($($fmt)+)));
        }
    }};
}

pub mod machine;
pub mod truthful;
