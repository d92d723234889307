//! The registry: every submitted [`OpDef`], built once, looked up by name or
//! by interned [`OpId`].

use std::collections::HashMap;
use std::sync::OnceLock;

use super::OpDef;
use crate::error::{Error, Result};

/// An interned op: an index into the registry, for hot paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(u32);

/// An op named in code, looked up once: the [`op!`](crate::op!) macro
/// makes one per call site, so a hot path calls by id rather than hashing
/// the name on every call.
#[derive(Clone, Debug)]
pub struct OpName {
    name: &'static str,
    id: OnceLock<OpId>,
}

impl OpName {
    /// The op called `name`, not yet looked up.
    pub const fn new(name: &'static str) -> OpName {
        OpName {
            name,
            id: OnceLock::new(),
        }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// Something that names a registered op: an [`OpId`], an [`OpName`], or
/// a name found in the registry on each call (ops chosen at run time).
pub trait AsOp {
    /// The op's id, or an error naming the registered ops.
    fn op_id(&self) -> Result<OpId>;
}

impl AsOp for OpId {
    fn op_id(&self) -> Result<OpId> {
        Ok(*self)
    }
}

impl AsOp for OpName {
    fn op_id(&self) -> Result<OpId> {
        if let Some(id) = self.id.get() {
            return Ok(*id);
        }
        let id = registry()?.id(self.name)?;
        Ok(*self.id.get_or_init(|| id))
    }
}

impl AsOp for str {
    fn op_id(&self) -> Result<OpId> {
        registry()?.id(self)
    }
}

/// A `&'static` [`OpName`] for a literal op name, interned at this call
/// site: `call(op!("add"), ..)`.
#[macro_export]
macro_rules! op {
    ($name:literal) => {{
        static OP: $crate::op::OpName = $crate::op::OpName::new($name);
        &OP
    }};
}

/// All registered ops, sorted by name.
pub struct Registry {
    ops: Vec<&'static OpDef>,
    by_name: HashMap<&'static str, OpId>,
}

/// The registry, built on first use. Two records with one name are a hard
/// error naming both definitions.
pub fn registry() -> Result<&'static Registry> {
    static REGISTRY: OnceLock<Result<Registry>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| Registry::build(inventory::iter::<OpDef>.into_iter().collect()))
        .as_ref()
        .map_err(Clone::clone)
}

impl Registry {
    fn build(mut ops: Vec<&'static OpDef>) -> Result<Registry> {
        ops.sort_by(|a, b| a.name.cmp(b.name).then(a.location.cmp(b.location)));
        if let Some(pair) = ops.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(Error::DuplicateOp {
                name: pair[0].name.to_string(),
                first: pair[0].location,
                second: pair[1].location,
            });
        }
        let by_name = ops
            .iter()
            .enumerate()
            .map(|(i, op)| (op.name, OpId(i as u32)))
            .collect();
        Ok(Registry { ops, by_name })
    }

    /// The id of `name`.
    pub fn id(&self, name: &str) -> Result<OpId> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| Error::UnknownOp {
                name: name.to_string(),
                known: self.names().join(", "),
            })
    }

    /// The op called `name`.
    pub fn get(&self, name: &str) -> Result<&'static OpDef> {
        self.id(name).map(|id| self.op(id))
    }

    /// The op with id `id`.
    pub fn op(&self, id: OpId) -> &'static OpDef {
        self.ops[id.0 as usize]
    }

    /// Every op name, sorted.
    pub fn names(&self) -> Vec<&'static str> {
        self.ops.iter().map(|op| op.name).collect()
    }

    /// Every op, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &'static OpDef> + '_ {
        self.ops.iter().copied()
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when no op is registered.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &'static str, location: &'static str) -> &'static OpDef {
        Box::leak(Box::new(OpDef {
            name,
            location,
            ..OpDef::DEFAULT
        }))
    }

    #[test]
    fn duplicates_name_both_sites() {
        let err = Registry::build(vec![
            record("b", "x.rs:1"),
            record("a", "y.rs:2"),
            record("b", "z.rs:3"),
        ])
        .err()
        .unwrap();
        let text = err.to_string();
        assert!(text.contains("x.rs:1") && text.contains("z.rs:3"), "{text}");
    }

    #[test]
    fn unknown_ops_list_sorted_names() {
        let reg = Registry::build(vec![record("mul", "a"), record("add", "b")]).unwrap();
        assert_eq!(reg.names(), vec!["add", "mul"]);
        let err = reg.get("sub").unwrap_err().to_string();
        assert!(err.contains("add, mul"), "{err}");
        assert_eq!(reg.op(reg.id("mul").unwrap()).name, "mul");
    }
}
