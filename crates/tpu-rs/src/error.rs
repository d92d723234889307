//! The error type of the tpu-rs facade.

/// Result with the facade's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in the facade: everything tpu-core reports, plus
/// misuse of autograd, layers and checkpoints.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// An error from the runtime, an op or a policy.
    #[error(transparent)]
    Core(#[from] tpu_core::Error),
    /// `backward()` on a tensor that needs an explicit gradient.
    #[error(
        "backward() on a tensor of shape {shape} needs a gradient argument (only scalars default to 1)"
    )]
    NonScalarBackward {
        /// The tensor's shape.
        shape: String,
    },
    /// `backward()` on a tensor that no recorded op produced from a tensor
    /// requiring gradients.
    #[error("backward() on a tensor that does not require grad")]
    NoGradient,
    /// `backward()` through ops whose saved values an earlier `backward()`
    /// already released.
    #[error(
        "backward() through a graph that an earlier backward() already freed; run the forward pass again"
    )]
    GraphFreed,
    /// A layer or function called with inputs of the wrong shape.
    #[error("{layer}: {reason} (called at {at})")]
    Shape {
        /// The layer, e.g. `Linear(in=4, out=3)`.
        layer: String,
        /// What is wrong.
        reason: String,
        /// The user's call (`file:line:column`).
        at: String,
    },
    /// A checkpoint that does not match the parameter store.
    #[error(
        "checkpoint does not match the model: {}",
        mismatch(missing, unexpected, mismatched)
    )]
    Checkpoint {
        /// Parameters the checkpoint lacks.
        missing: String,
        /// Tensors the model does not have.
        unexpected: String,
        /// `name: checkpoint shape vs model shape`.
        mismatched: String,
    },
    /// A global batch whose rows do not split into one equal shard per
    /// data-parallel replica.
    #[error(
        "DataParallel: a batch of shape {shape} ({rows} rows) does not split into {replicas} equal shards; use a batch size divisible by {replicas}"
    )]
    UnevenBatch {
        /// The batch's shape.
        shape: String,
        /// Its rows (leading dimension).
        rows: usize,
        /// The number of replicas.
        replicas: usize,
    },
    /// Data-parallel replicas that do not match their device group or each
    /// other (or optimizers that do not match the replicas).
    #[error("DataParallel over {group}: {reason}")]
    Replicas {
        /// The devices, e.g. `tpu:{0, 1}`.
        group: String,
        /// What is wrong, naming the rank.
        reason: String,
    },
    /// Reading or writing a file.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
}

/// The non-empty categories of a checkpoint mismatch.
fn mismatch(missing: &str, unexpected: &str, mismatched: &str) -> String {
    [
        ("missing", missing),
        ("unexpected", unexpected),
        ("mis-shaped", mismatched),
    ]
    .iter()
    .filter(|(_, names)| !names.is_empty())
    .map(|(what, names)| format!("{what} [{names}]"))
    .collect::<Vec<_>>()
    .join(", ")
}

impl Error {
    /// A [`Error::Shape`] of `layer`, at the caller's call (layers' methods
    /// pass their caller's location on).
    #[track_caller]
    pub fn shape(layer: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Shape {
            layer: layer.into(),
            reason: reason.into(),
            at: std::panic::Location::caller().to_string(),
        }
    }
}
