//! The error type of tpu-core.

use std::fmt;
use std::path::PathBuf;

use crate::op::OpErrorKind;
use crate::{DType, Shape};

/// Result with tpu-core's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong below the op layer. Each variant names what
/// failed and on which device or plugin, so messages stand on their own.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// No plugin matched a name, or a path does not exist.
    #[error("no PJRT plugin `{name}` found (searched: {searched}); {hint}")]
    PluginNotFound {
        /// What was asked for: a name like `cpu` or a path.
        name: String,
        /// Where we looked.
        searched: String,
        /// How to get one.
        hint: String,
    },
    /// The file exists but is not a usable PJRT plugin.
    #[error("cannot load PJRT plugin {path}: {reason}")]
    PluginLoad {
        /// The plugin file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The plugin's function table does not reach a function we need.
    #[error("PJRT plugin {plugin} (API {api}) does not provide {function}")]
    MissingFunction {
        /// The PJRT function, e.g. `PJRT_Client_Create`.
        function: &'static str,
        /// The plugin file name.
        plugin: String,
        /// The plugin's PJRT API version.
        api: String,
    },
    /// libtpu loaded but found no TPU chips on this machine.
    #[error(
        "no TPU found on this machine (libtpu: {detail}); use TPU_RS_PLUGIN=cpu to run on the XLA CPU plugin"
    )]
    NoTpuFound {
        /// libtpu's own message.
        detail: String,
    },
    /// A PJRT call returned an error.
    #[error("{call} failed in {plugin} ({code}): {message}")]
    Pjrt {
        /// The PJRT function that failed.
        call: &'static str,
        /// The plugin's file name.
        plugin: String,
        /// PJRT's status code.
        code: ErrorCode,
        /// PJRT's message.
        message: String,
    },
    /// A compile or client option was rejected before reaching the plugin.
    #[error("invalid option `{option}`: {reason}")]
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// Why it is invalid.
        reason: String,
    },
    /// A device index beyond the client's addressable devices.
    #[error(
        "tpu:{index} does not exist: this process sees {count} tpu device(s), those of the {platform} plugin"
    )]
    DeviceOutOfRange {
        /// The index asked for.
        index: usize,
        /// How many devices there are.
        count: usize,
        /// The platform.
        platform: String,
    },
    /// Host data whose length does not match dtype and shape.
    #[error("a {dtype} buffer of shape {shape} needs {expected} bytes, got {actual}")]
    BufferSize {
        /// Element type.
        dtype: DType,
        /// Shape.
        shape: Shape,
        /// Bytes the dtype and shape need.
        expected: usize,
        /// Bytes provided.
        actual: usize,
    },
    /// A typed read of a buffer with another dtype.
    #[error("cannot read a {actual} buffer as {expected}")]
    DTypeMismatch {
        /// The requested dtype.
        expected: DType,
        /// The buffer's dtype.
        actual: DType,
    },
    /// An element type the runtime cannot carry.
    #[error("unsupported element type `{0}`")]
    UnsupportedType(String),
    /// An executable was given the wrong number of arguments.
    #[error("executable `{program}` takes {expected} argument(s), got {actual}")]
    ArgumentCount {
        /// The program's name.
        program: String,
        /// Parameters the program declares.
        expected: usize,
        /// Arguments given.
        actual: usize,
    },
    /// An executable argument of the wrong type, shape or device.
    #[error("executable `{program}` argument {index}: expected {expected}, got {actual}")]
    ArgumentMismatch {
        /// The program's name.
        program: String,
        /// The argument's position.
        index: usize,
        /// What the program declares.
        expected: String,
        /// What was given.
        actual: String,
    },
    /// An executable was given argument lists for the wrong number of devices.
    #[error("executable `{program}` runs on {expected} device(s), got argument lists for {actual}")]
    DeviceCount {
        /// The program's name.
        program: String,
        /// Devices the executable runs on.
        expected: usize,
        /// Argument lists given.
        actual: usize,
    },
    /// No op of that name is registered.
    #[error("unknown op `{name}`; registered ops: {known}")]
    UnknownOp {
        /// The name asked for.
        name: String,
        /// Every registered name, sorted.
        known: String,
    },
    /// Two op records share a name.
    #[error("op `{name}` is registered twice: at {first} and at {second}")]
    DuplicateOp {
        /// The shared name.
        name: String,
        /// One definition.
        first: &'static str,
        /// The other.
        second: &'static str,
    },
    /// An op called with inputs or attributes it cannot take.
    #[error("op `{op}` on {device} with inputs ({inputs}): {reason}")]
    InvalidInput {
        /// What kind of mistake (which Python exception fits).
        kind: OpErrorKind,
        /// The op.
        op: String,
        /// The input types, e.g. `f32[2, 3], f32[4]`.
        inputs: String,
        /// Where it was to run.
        device: String,
        /// What is wrong.
        reason: String,
    },
    /// A compile-cache folder that is not this user's alone: loading an
    /// executable from it would run code someone else could have written.
    #[error(
        "refusing the compile cache folder {dir}: {reason}; make it yours alone (`chmod 700`), or set TPU_RS_CACHE_DIR to another folder (empty turns the disk cache off)"
    )]
    UnsafeCacheDir {
        /// The folder.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The host reference device cannot hold an op's outputs.
    #[error(
        "op `{op}` on cpu needs {requested} bytes for its outputs; the host has {available} bytes available"
    )]
    HostOutOfMemory {
        /// The op.
        op: String,
        /// Bytes its outputs need on the host.
        requested: u64,
        /// Bytes the host reports available.
        available: u64,
    },
    /// An op failed after its inputs were accepted (execution, compilation
    /// of a fused graph, a Debug-mode check).
    #[error("op `{op}` called at {location} with inputs ({inputs}) failed: {source}")]
    OpFailed {
        /// The op.
        op: String,
        /// The caller's source location.
        location: String,
        /// The input types.
        inputs: String,
        /// What went wrong.
        source: Box<Error>,
    },
    /// Debug mode found NaN or infinity in an op's output.
    #[error("op `{op}` called at {location} produced {what} in output {output}")]
    NonFinite {
        /// The op.
        op: String,
        /// The caller's source location.
        location: String,
        /// Which output.
        output: usize,
        /// `NaN` or `infinity`.
        what: &'static str,
    },
    /// Debug mode's parity check: the device result differs from the op's
    /// reference (the first op to do so).
    #[error(
        "op `{op}` called at {location} diverges from its reference in output {output}: {detail}"
    )]
    Divergence {
        /// The op.
        op: String,
        /// The caller's source location.
        location: String,
        /// Which output.
        output: usize,
        /// The worst element and its error.
        detail: String,
    },
    /// A profile trace could not be started or written.
    #[error("cannot record the profile trace {path}: {reason}")]
    Profile {
        /// The trace file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A record of programs (`TPU_RS_RECORD_PROGRAMS`) could not be
    /// written or read.
    #[error("program record {path}: {reason}")]
    ProgramRecord {
        /// The record file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A StableHLO program whose entry signature we cannot read.
    #[error("cannot read the signature of @main: {0}")]
    Signature(String),
    /// The processes of a job could not meet: the rendezvous store is
    /// unreachable, or a key was not set in time.
    #[error("rendezvous at {address} failed: {reason}")]
    Rendezvous {
        /// The store's `host:port`.
        address: String,
        /// What went wrong.
        reason: String,
    },
    /// A collective across processes failed: a peer died, did not arrive
    /// in time, or called it with another shape or dtype.
    #[error("collective `{op}` #{seq} on rank {rank} of {world_size} failed{}: {reason}", missing_ranks(.missing))]
    Collective {
        /// The collective, e.g. `all_reduce`.
        op: String,
        /// Its sequence number in the group (0 for the first).
        seq: u64,
        /// The rank that reports it.
        rank: usize,
        /// The group's number of processes.
        world_size: usize,
        /// Ranks that did not reach this collective, where known.
        missing: Vec<usize>,
        /// What went wrong.
        reason: String,
    },
}

impl Error {
    /// The kind of an op's rejection of its call, for this error or the
    /// op error it wraps; `None` for failures that are not the call's fault.
    pub fn op_error_kind(&self) -> Option<OpErrorKind> {
        match self {
            Error::InvalidInput { kind, .. } => Some(*kind),
            Error::OpFailed { source, .. } => source.op_error_kind(),
            _ => None,
        }
    }

    /// Whether this error, or one it wraps, is memory running out: PJRT's
    /// `ResourceExhausted`, or the host unable to hold an op's outputs.
    pub fn is_out_of_memory(&self) -> bool {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = next {
            // A wrapped error (`OpFailed`'s) is its source as a box.
            let core = e
                .downcast_ref::<Error>()
                .or_else(|| e.downcast_ref::<Box<Error>>().map(|b| &**b));
            match core {
                Some(Error::Pjrt { code, .. }) if *code == ErrorCode::ResourceExhausted => {
                    return true;
                }
                Some(Error::HostOutOfMemory { .. }) => return true,
                _ => next = e.source(),
            }
        }
        false
    }
}

/// `" (ranks 1, 3 did not arrive)"`, or nothing when none are known.
fn missing_ranks(missing: &[usize]) -> String {
    if missing.is_empty() {
        return String::new();
    }
    let list: Vec<String> = missing.iter().map(ToString::to_string).collect();
    let noun = if missing.len() == 1 { "rank" } else { "ranks" };
    format!(" ({noun} {} did not arrive)", list.join(", "))
}

/// PJRT's status codes (the absl codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl ErrorCode {
    /// The code for PJRT's integer value; anything unknown is `Unknown`.
    pub fn from_raw(code: u32) -> ErrorCode {
        use ErrorCode::*;
        match code {
            1 => Cancelled,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            _ => Unknown,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_running_out_is_found_inside_the_op_that_failed() {
        let exhausted = Error::Pjrt {
            call: "PJRT_LoadedExecutable_Execute",
            plugin: "plugin.so".into(),
            code: ErrorCode::ResourceExhausted,
            message: "Out of memory".into(),
        };
        assert!(exhausted.is_out_of_memory());
        let wrapped = Error::OpFailed {
            op: "add".into(),
            location: "here".into(),
            inputs: "f32[2]".into(),
            source: Box::new(exhausted),
        };
        assert!(wrapped.is_out_of_memory());
        let other = Error::OpFailed {
            op: "add".into(),
            location: "here".into(),
            inputs: "f32[2]".into(),
            source: Box::new(Error::Signature("no".into())),
        };
        assert!(!other.is_out_of_memory());
    }
}
