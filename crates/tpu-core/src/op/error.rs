//! Why an op rejected a call: a kind that says which Python exception (or
//! Rust match arm) fits, and a message naming what is wrong. The dispatcher
//! adds the op, the input types and the device
//! ([`crate::Error::InvalidInput`]).

use std::fmt;

use crate::error::Error;

/// What kind of mistake a call made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OpErrorKind {
    /// Shapes, dtypes or attributes the op cannot take (PyTorch's
    /// `RuntimeError`).
    #[default]
    Invalid,
    /// A dimension or index that does not address the tensor: beyond its
    /// bounds, along an empty dimension, or an index tensor of the wrong
    /// rank (`IndexError`).
    OutOfRange,
    /// A valid call the op does not implement, e.g. for a dtype
    /// (`NotImplementedError`).
    Unsupported,
}

/// An op's error: its kind and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    /// What kind of mistake.
    pub kind: OpErrorKind,
    /// What is wrong, e.g. `dimension 3 is out of range for rank 2`.
    pub message: String,
}

/// What op implementations return.
pub type OpResult<T> = std::result::Result<T, OpError>;

impl OpError {
    /// An error of `kind`.
    pub fn new(kind: OpErrorKind, message: impl Into<String>) -> OpError {
        OpError {
            kind,
            message: message.into(),
        }
    }

    /// Shapes, dtypes or attributes the op cannot take.
    pub fn invalid(message: impl Into<String>) -> OpError {
        OpError::new(OpErrorKind::Invalid, message)
    }

    /// A dimension or index out of range.
    pub fn out_of_range(message: impl Into<String>) -> OpError {
        OpError::new(OpErrorKind::OutOfRange, message)
    }

    /// A call the op does not implement.
    pub fn unsupported(message: impl Into<String>) -> OpError {
        OpError::new(OpErrorKind::Unsupported, message)
    }

    /// The same error with `context` before its message.
    pub fn context(self, context: impl fmt::Display) -> OpError {
        OpError::new(self.kind, format!("{context}: {}", self.message))
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpError {}

/// Plain messages are [`OpErrorKind::Invalid`].
impl From<String> for OpError {
    fn from(message: String) -> OpError {
        OpError::invalid(message)
    }
}

impl From<&str> for OpError {
    fn from(message: &str) -> OpError {
        OpError::invalid(message)
    }
}

/// An error from an op that a backward rule or a composite called: its text
/// as it is, and its kind where it has one.
impl From<Error> for OpError {
    fn from(e: Error) -> OpError {
        OpError::new(e.op_error_kind().unwrap_or_default(), e.to_string())
    }
}

/// `Err(invalid!("..."))`: an [`OpErrorKind::Invalid`] error, formatted.
#[macro_export]
macro_rules! invalid {
    ($($arg:tt)*) => { $crate::op::OpError::invalid(format!($($arg)*)) };
}

/// `Err(out_of_range!("..."))`: an [`OpErrorKind::OutOfRange`] error, formatted.
#[macro_export]
macro_rules! out_of_range {
    ($($arg:tt)*) => { $crate::op::OpError::out_of_range(format!($($arg)*)) };
}

/// `Err(unsupported!("..."))`: an [`OpErrorKind::Unsupported`] error, formatted.
#[macro_export]
macro_rules! unsupported {
    ($($arg:tt)*) => { $crate::op::OpError::unsupported(format!($($arg)*)) };
}
