//! What stops the gateway, and the exit code it stands for.

/// Why `once gateway` stopped with an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// Bad input, found before anything was served: the config file, a tool it
    /// names that the upstream lacks, a policy the engine refuses, no upstream
    /// command. Exit code 2.
    #[error("{0}")]
    Config(String),
    /// A failure at run time: the upstream, the ledger, the async runtime, the
    /// client's handshake. Exit code 1.
    #[error("{0}")]
    Runtime(String),
}

impl GatewayError {
    /// The process exit code: 2 for bad input, 1 for a run-time failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            GatewayError::Config(_) => 2,
            GatewayError::Runtime(_) => 1,
        }
    }
}
