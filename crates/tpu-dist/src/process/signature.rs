//! What a rank says it is calling, exchanged before every collective so
//! that ranks which disagree fail instead of mixing up bytes.

use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};

use tpu_core::{DType, HostBuffer};

use crate::ReduceOp;

/// Encoded length of a signature.
pub(crate) const LEN: usize = 64;
/// Dimensions stored as they are; a longer shape keeps a hash of the rest.
const DIMS: usize = 5;

/// A collective and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce(ReduceOp),
    AllGather {
        dim: usize,
    },
    ReduceScatter {
        op: ReduceOp,
        dim: usize,
    },
    Broadcast {
        root: usize,
    },
    AllToAll {
        split_dim: usize,
        concat_dim: usize,
    },
    /// The split sizes of an all-to-all with uneven blocks.
    AllToAllSizes,
    SendRecv,
    Barrier,
}

/// A collective as one rank calls it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    kind: Kind,
    dtype: DType,
    dims: Vec<usize>,
}

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Mean,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Prod,
];

impl Signature {
    /// `kind` on the tensor in `x`.
    pub(crate) fn new(kind: Kind, x: &HostBuffer) -> Signature {
        Signature::of(kind, x.dtype(), x.shape().dims())
    }

    /// `kind` on a tensor of `dtype` and `dims`.
    pub(crate) fn of(kind: Kind, dtype: DType, dims: &[usize]) -> Signature {
        Signature {
            kind,
            dtype,
            dims: dims.to_vec(),
        }
    }

    /// The op as errors name it.
    pub(crate) fn op_name(&self) -> &'static str {
        match self.kind {
            Kind::AllReduce(_) => "all_reduce",
            Kind::AllGather { .. } => "all_gather",
            Kind::ReduceScatter { .. } => "reduce_scatter",
            Kind::Broadcast { .. } => "broadcast",
            Kind::AllToAll { .. } | Kind::AllToAllSizes => "all_to_all",
            Kind::SendRecv => "send/recv",
            Kind::Barrier => "barrier",
        }
    }

    /// The input as errors name it: `f32[2, 3]`.
    pub(crate) fn input(&self) -> String {
        format!("{}{:?}", self.dtype, self.dims)
    }

    /// The fixed-size form every rank exchanges.
    pub(crate) fn encode(&self) -> [u8; LEN] {
        let mut out = [0; LEN];
        let op_index = |op: ReduceOp| OPS.iter().position(|&o| o == op).unwrap_or(0) as u8;
        let (code, op, a, b) = match self.kind {
            Kind::AllReduce(op) => (1, op_index(op), 0, 0),
            Kind::AllGather { dim } => (2, 0, dim, 0),
            Kind::ReduceScatter { op, dim } => (3, op_index(op), dim, 0),
            Kind::Broadcast { root } => (4, 0, root, 0),
            Kind::AllToAll {
                split_dim,
                concat_dim,
            } => (5, 0, split_dim, concat_dim),
            Kind::SendRecv => (6, 0, 0, 0),
            Kind::Barrier => (7, 0, 0, 0),
            Kind::AllToAllSizes => (8, 0, 0, 0),
        };
        out[0] = code;
        out[1] = op;
        out[2] = DType::ALL
            .iter()
            .position(|&d| d == self.dtype)
            .unwrap_or(0) as u8;
        out[3] = self.dims.len().min(255) as u8;
        out[8..16].copy_from_slice(&(a as u64).to_le_bytes());
        out[16..24].copy_from_slice(&(b as u64).to_le_bytes());
        for (i, slot) in out[24..].chunks_exact_mut(8).enumerate() {
            let value = if i == DIMS - 1 && self.dims.len() > DIMS {
                let mut h = DefaultHasher::new();
                self.dims[i..].hash(&mut h);
                h.finish()
            } else {
                self.dims.get(i).copied().unwrap_or(0) as u64
            };
            slot.copy_from_slice(&value.to_le_bytes());
        }
        out
    }

    /// Ok if every rank's signature in `all` (one [`LEN`] block per rank)
    /// equals this one, else which rank differs and how.
    pub(crate) fn agree(&self, all: &[u8], rank: usize) -> Result<(), String> {
        let mine = self.encode();
        for (r, theirs) in all.chunks_exact(LEN).enumerate() {
            if theirs != mine {
                return Err(format!(
                    "rank {r} called {} while rank {rank} called {self}",
                    describe(theirs)
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe(&self.encode()))
    }
}

/// A signature's encoded form in words: `all_reduce(sum) on f32[4, 2]`.
pub(crate) fn describe(bytes: &[u8]) -> String {
    let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    let op = OPS
        .get(usize::from(bytes[1]))
        .copied()
        .unwrap_or(ReduceOp::Sum);
    let (a, b) = (word(8), word(16));
    let what = match bytes[0] {
        1 => format!("all_reduce({op})"),
        2 => format!("all_gather(dim {a})"),
        3 => format!("reduce_scatter({op}, dim {a})"),
        4 => format!("broadcast(root {a})"),
        5 => format!("all_to_all(split {a}, concat {b})"),
        6 => "send/recv".to_string(),
        7 => return "barrier".to_string(),
        8 => "all_to_all(split sizes)".to_string(),
        other => format!("an unknown collective ({other})"),
    };
    let dtype = DType::ALL
        .get(usize::from(bytes[2]))
        .map_or_else(|| "?".to_string(), ToString::to_string);
    let ndim = usize::from(bytes[3]);
    let mut dims: Vec<String> = (0..ndim.min(DIMS))
        .map(|i| word(24 + 8 * i).to_string())
        .collect();
    if ndim > DIMS {
        dims.pop();
        dims.push(format!("... ({ndim} dims)"));
    }
    format!("{what} on {dtype}[{}]", dims.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_calls_agree_and_differences_are_named() {
        let a = Signature::of(Kind::AllReduce(ReduceOp::Sum), DType::F32, &[4, 2]);
        let b = Signature::of(Kind::AllReduce(ReduceOp::Sum), DType::F32, &[8]);
        let mut all = a.encode().to_vec();
        all.extend_from_slice(&a.encode());
        assert!(a.agree(&all, 0).is_ok());
        all.extend_from_slice(&b.encode());
        let err = a.agree(&all, 0).unwrap_err();
        assert_eq!(
            err,
            "rank 2 called all_reduce(sum) on f32[8] while rank 0 called all_reduce(sum) on f32[4, 2]"
        );
    }

    #[test]
    fn dtype_op_and_parameters_all_count() {
        let base = Signature::of(Kind::AllGather { dim: 0 }, DType::F32, &[2]);
        for other in [
            Signature::of(Kind::AllGather { dim: 0 }, DType::BF16, &[2]),
            Signature::of(Kind::AllGather { dim: 1 }, DType::F32, &[2]),
            Signature::of(Kind::Broadcast { root: 0 }, DType::F32, &[2]),
            Signature::of(Kind::AllReduce(ReduceOp::Max), DType::F32, &[2]),
        ] {
            assert_ne!(base.encode(), other.encode(), "{other}");
        }
    }

    #[test]
    fn long_shapes_differ_in_their_tail() {
        let a = Signature::of(Kind::SendRecv, DType::I32, &[1, 2, 3, 4, 5, 6, 7]);
        let b = Signature::of(Kind::SendRecv, DType::I32, &[1, 2, 3, 4, 5, 6, 8]);
        assert_ne!(a.encode(), b.encode());
        assert_eq!(a.to_string(), "send/recv on i32[1, 2, 3, 4, ... (7 dims)]");
    }
}
