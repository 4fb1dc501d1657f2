//! The HTTP serving `once gateway --listen` and `once ui` share, so that a
//! slow or hostile client meets the same limits on both: hyper's HTTP/1.1
//! connection with a header read timeout, a cap on the connections that have
//! not yet carried an authenticated request ([`admission`]), and a request
//! body read within a deadline and a size limit ([`body`]).

#![deny(missing_docs)]

pub mod admission;
pub mod body;

pub use admission::{Admission, Connection, Limits, serve};
