//! Op attributes: the static parameters of an op call (`dims`, `keepdim`,
//! `dtype`, ...). They are part of what a compiled program is keyed on.

use crate::invalid;
use std::fmt;
use std::hash::{Hash, Hasher};

use super::OpResult;
use crate::DType;

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// A flag.
    Bool(bool),
    /// An integer (axis, count, index).
    Int(i64),
    /// A list of integers (dims, shape, strides).
    Ints(Vec<i64>),
    /// A float (epsilon, fill value, probability).
    Float(f64),
    /// An element type.
    DType(DType),
    /// A keyword (`"tanh"`, `"mean"`).
    Str(String),
}

impl Hash for Attr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Attr::Bool(b) => b.hash(state),
            Attr::Int(i) => i.hash(state),
            Attr::Ints(v) => v.hash(state),
            Attr::Float(f) => f.to_bits().hash(state),
            Attr::DType(d) => d.hash(state),
            Attr::Str(s) => s.hash(state),
        }
    }
}

// Floats compare by value; attributes never hold NaN keys in practice, and
// hashing by bits keeps equal values in one bucket.
impl Eq for Attr {}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Bool(b) => write!(f, "{b}"),
            Attr::Int(i) => write!(f, "{i}"),
            Attr::Ints(v) => write!(f, "{v:?}"),
            Attr::Float(x) => write!(f, "{x}"),
            Attr::DType(d) => write!(f, "{d}"),
            Attr::Str(s) => write!(f, "{s:?}"),
        }
    }
}

macro_rules! attr_from {
    ($($t:ty => $v:ident($conv:expr)),* $(,)?) => {$(
        impl From<$t> for Attr {
            fn from(x: $t) -> Attr {
                Attr::$v($conv(x))
            }
        }
    )*};
}

attr_from!(
    bool => Bool(|x| x),
    i64 => Int(|x| x),
    i32 => Int(i64::from),
    usize => Int(|x: usize| x as i64),
    f64 => Float(|x| x),
    f32 => Float(f64::from),
    DType => DType(|x| x),
    &str => Str(str::to_string),
    Vec<i64> => Ints(|x| x),
    &[i64] => Ints(<[i64]>::to_vec),
    Vec<usize> => Ints(|x: Vec<usize>| x.into_iter().map(|d| d as i64).collect()),
    &[usize] => Ints(|x: &[usize]| x.iter().map(|&d| d as i64).collect()),
);

/// The attributes of one op call, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Attrs(Vec<(&'static str, Attr)>);

impl Attrs {
    /// No attributes.
    pub fn new() -> Attrs {
        Attrs(Vec::new())
    }

    /// Adds (or replaces) `key`.
    pub fn with(mut self, key: &'static str, value: impl Into<Attr>) -> Attrs {
        self.set(key, value);
        self
    }

    /// Sets `key`.
    pub fn set(&mut self, key: &'static str, value: impl Into<Attr>) {
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key, value)),
        }
    }

    /// The raw value of `key`.
    pub fn get(&self, key: &str) -> Option<&Attr> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Every attribute in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Attr)> {
        self.0.iter().map(|(k, v)| (*k, v))
    }

    fn typed<T>(
        &self,
        key: &str,
        kind: &str,
        pick: impl Fn(&Attr) -> Option<T>,
    ) -> OpResult<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => pick(v)
                .map(Some)
                .ok_or_else(|| invalid!("attribute `{key}` must be {kind}, got {v}")),
        }
    }

    fn required<T>(value: OpResult<Option<T>>, key: &str) -> OpResult<T> {
        value?.ok_or_else(|| invalid!("missing attribute `{key}`"))
    }

    /// Integer `key`, or `default` when absent.
    pub fn int_or(&self, key: &str, default: i64) -> OpResult<i64> {
        Ok(self.int_opt(key)?.unwrap_or(default))
    }

    /// Integer `key`, if present.
    pub fn int_opt(&self, key: &str) -> OpResult<Option<i64>> {
        self.typed(key, "an integer", |v| match v {
            Attr::Int(i) => Some(*i),
            _ => None,
        })
    }

    /// Integer `key`, required.
    pub fn int(&self, key: &str) -> OpResult<i64> {
        Self::required(self.int_opt(key), key)
    }

    /// Integer list `key`, if present.
    pub fn ints_opt(&self, key: &str) -> OpResult<Option<Vec<i64>>> {
        self.typed(key, "a list of integers", |v| match v {
            Attr::Ints(v) => Some(v.clone()),
            Attr::Int(i) => Some(vec![*i]),
            _ => None,
        })
    }

    /// Integer list `key`, required.
    pub fn ints(&self, key: &str) -> OpResult<Vec<i64>> {
        Self::required(self.ints_opt(key), key)
    }

    /// Float `key` (integers accepted), if present.
    pub fn float_opt(&self, key: &str) -> OpResult<Option<f64>> {
        self.typed(key, "a number", |v| match v {
            Attr::Float(f) => Some(*f),
            Attr::Int(i) => Some(*i as f64),
            _ => None,
        })
    }

    /// Float `key`, or `default` when absent.
    pub fn float_or(&self, key: &str, default: f64) -> OpResult<f64> {
        Ok(self.float_opt(key)?.unwrap_or(default))
    }

    /// Float `key`, required.
    pub fn float(&self, key: &str) -> OpResult<f64> {
        Self::required(self.float_opt(key), key)
    }

    /// Bool `key`, or `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> OpResult<bool> {
        Ok(self
            .typed(key, "a bool", |v| match v {
                Attr::Bool(b) => Some(*b),
                _ => None,
            })?
            .unwrap_or(default))
    }

    /// DType `key`, if present.
    pub fn dtype_opt(&self, key: &str) -> OpResult<Option<DType>> {
        self.typed(key, "a dtype", |v| match v {
            Attr::DType(d) => Some(*d),
            _ => None,
        })
    }

    /// DType `key`, required.
    pub fn dtype(&self, key: &str) -> OpResult<DType> {
        Self::required(self.dtype_opt(key), key)
    }

    /// String `key`, or `default` when absent.
    pub fn str_or<'a>(&'a self, key: &str, default: &'a str) -> OpResult<&'a str> {
        match self.get(key) {
            None => Ok(default),
            Some(Attr::Str(s)) => Ok(s),
            Some(v) => Err(invalid!("attribute `{key}` must be a string, got {v}")),
        }
    }
}

impl fmt::Display for Attrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{k}: {v}")?;
        }
        write!(f, "}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_access_and_errors() {
        let a = Attrs::new()
            .with("dim", 1i64)
            .with("keepdim", true)
            .with("dims", vec![0i64, 2]);
        assert_eq!(a.int("dim"), Ok(1));
        assert_eq!(a.bool_or("keepdim", false), Ok(true));
        assert_eq!(a.ints("dims"), Ok(vec![0, 2]));
        assert_eq!(a.ints("dim"), Ok(vec![1]));
        assert!(a.int("missing").unwrap_err().message.contains("missing"));
        assert!(
            a.bool_or("dim", false)
                .unwrap_err()
                .message
                .contains("must be a bool")
        );
        assert_eq!(a.float_or("eps", 1e-5), Ok(1e-5));
    }

    #[test]
    fn equal_attrs_hash_equal() {
        use std::collections::hash_map::DefaultHasher;
        let h = |a: &Attrs| {
            let mut s = DefaultHasher::new();
            a.hash(&mut s);
            s.finish()
        };
        let a = Attrs::new().with("p", 0.5f64);
        assert_eq!(h(&a), h(&a.clone()));
        assert_ne!(h(&a), h(&Attrs::new().with("p", 0.25f64)));
    }
}
