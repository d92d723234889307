//! Shape bucketing for sequences that grow one step at a time (a KV cache,
//! generated token ids, an attention mask); on by default (`pow2`).
//!
//! Every program is built for its input shapes, so a tensor that grows by
//! `torch.cat` builds new programs for everything that reads it, at every
//! length. With buckets on, `cat` keeps its result in a storage padded
//! along the joined dim to the next bucket ([`Padded`]): appending writes
//! at a run-time offset (`dynamic_update_slice`), windows such as
//! `x[:, -1:]` read at a run-time start (`dynamic_slice`), and attention
//! over a padded key and value masks the padding. Those programs are built
//! once per bucket; anything else reads the compact value, exactly as
//! without buckets. Only appends to a longer tensor are padded: that is
//! how a sequence grows, and other joins are read whole.
//!
//! Set with `TPU_RS_SHAPE_BUCKETS` (`pow2`, the default; sizes such as
//! `64,128,256`; or `off`) or `torch.tpu.set_shape_buckets`.
//!
//! Attention over a padded key and value needs a kernel above autograd
//! (`aten/nn.py`); it is registered at the first padded join after the
//! buckets were set, so a process that never grows a sequence (training)
//! keeps PyTorch's own attention with no Python on its path.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use pyo3::types::PyList;
use tpu_core::op::Attrs;
use tpu_core::{DType, Tensor};

use crate::error::{BridgeError, Result};
use crate::kernels::scalar;
use crate::kernels::{call, call1, cast};
use crate::storage::Padded;
use crate::torch::{View, dtype_of, wrap, wrap_padded};

/// The environment variable that sets the buckets for a process.
const ENV: &str = "TPU_RS_SHAPE_BUCKETS";

/// The buckets when the environment sets none.
const DEFAULT: &str = "pow2";

/// Whether attention is routed to the padded-aware kernel (see the module
/// docs); cleared when the buckets are set.
static ATTENTION_ROUTED: AtomicBool = AtomicBool::new(false);

/// `pow2`: powers of two from this size...
const POW2_FIRST: usize = 16;
/// ...up to this one; longer dims are not padded.
const POW2_LAST: usize = 1 << 24;

/// The bucket sizes in force, ascending; empty when off. `None` until read
/// from the environment.
static BUCKETS: RwLock<Option<Vec<usize>>> = RwLock::new(None);

/// Parses a bucket spec (`pow2`, comma-separated sizes, or `off`/empty)
/// into ascending sizes; `None` when it is none of those.
fn parse(spec: &str) -> Option<Vec<usize>> {
    let spec = spec.trim();
    if spec.is_empty() || spec == "off" || spec == "0" {
        return Some(Vec::new());
    }
    if spec == "pow2" {
        return Some(
            std::iter::successors(Some(POW2_FIRST), |&b| Some(b * 2))
                .take_while(|&b| b <= POW2_LAST)
                .collect(),
        );
    }
    let mut sizes = spec
        .split(',')
        .map(|s| s.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<Vec<_>>>()?;
    sizes.sort_unstable();
    sizes.dedup();
    Some(sizes)
}

/// [`parse`], or a `ValueError` naming `source` and the spec.
fn parse_or_explain(spec: &str, source: &str) -> Result<Vec<usize>> {
    parse(spec).ok_or_else(|| {
        BridgeError::Python(pyo3::exceptions::PyValueError::new_err(format!(
            "{source}: shape buckets are `pow2`, `off` or positive sizes such as `64,128,256`, got `{spec}`"
        )))
    })
}

/// The bucket sizes in force (empty when off).
fn current() -> Result<Vec<usize>> {
    if let Some(b) = BUCKETS.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return Ok(b.clone());
    }
    let spec = std::env::var(ENV).unwrap_or_else(|_| DEFAULT.to_string());
    let sizes = parse_or_explain(&spec, ENV)?;
    *BUCKETS.write().unwrap_or_else(|e| e.into_inner()) = Some(sizes.clone());
    Ok(sizes)
}

/// The smallest bucket that holds `len`, if any.
fn bucket(sizes: &[usize], len: usize) -> Option<usize> {
    sizes.iter().copied().find(|&b| b >= len)
}

/// The bucket sizes in force; empty when bucketing is off.
#[pyfunction]
pub fn shape_buckets() -> PyResult<Vec<usize>> {
    Ok(current()?)
}

/// Sets the bucket sizes from a spec (see [`parse`]); returns the sizes.
#[pyfunction]
pub fn set_shape_buckets(spec: &str) -> PyResult<Vec<usize>> {
    let sizes = parse_or_explain(spec, "set_shape_buckets")?;
    *BUCKETS.write().unwrap_or_else(|e| e.into_inner()) = Some(sizes.clone());
    ATTENTION_ROUTED.store(false, Ordering::Relaxed);
    Ok(sizes)
}

/// Routes attention to the padded-aware kernel, once per setting of the
/// buckets: a padded key and value may now reach it.
fn route_attention() -> Result<()> {
    if ATTENTION_ROUTED.swap(true, Ordering::Relaxed) {
        return Ok(());
    }
    Python::attach(|py| {
        py.import("torch_tpu_rs.aten.nn")?
            .call_method1("route_attention", (true,))
            .map(drop)
    })
    .map_err(BridgeError::Python)
}

/// `torch.cat(tensors, dim)` into a padded storage, or `None` when buckets
/// are off or do not apply (then the caller joins as usual, which also
/// reports any bad input).
#[pyfunction]
pub fn concat<'py>(
    py: Python<'py>,
    tensors: &Bound<'py, PyList>,
    dim: i64,
    dtype: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let mut views = Vec::with_capacity(tensors.len());
    for t in tensors.iter() {
        match View::of(&t)? {
            Some(view) => views.push(view),
            None => return Ok(None),
        }
    }
    match concat_views(&views, dim, dtype_of(dtype)?)? {
        Some(padded) => Ok(Some(wrap_padded(py, padded)?)),
        None => Ok(None),
    }
}

/// [`concat`] of tpu views: the padded join, or `None`.
pub fn concat_views(views: &[View], dim: i64, dtype: DType) -> Result<Option<Padded>> {
    let sizes = current()?;
    if sizes.is_empty() {
        return Ok(None);
    }
    let Some(plan) = Plan::of(views, dim, &sizes) else {
        return Ok(None);
    };
    let padded = plan.join(views, dtype)?;
    route_attention()?;
    Ok(Some(padded))
}

/// How a join into a padded storage goes.
struct Plan {
    dim: usize,
    len: usize,
    capacity: usize,
    device: usize,
}

impl Plan {
    /// A plan when the inputs can be joined along `dim` (same rank, same
    /// device, equal sizes off `dim`) and their total fits a bucket.
    fn of(views: &[View], dim: i64, sizes: &[usize]) -> Option<Plan> {
        let first = views.first()?;
        let rank = first.layout.size.len();
        let dim = if dim < 0 { dim + rank as i64 } else { dim };
        if rank == 0 || dim < 0 || dim >= rank as i64 {
            return None;
        }
        let dim = dim as usize;
        let device = first.storage.device();
        let mut len = 0;
        for v in views {
            let size = &v.layout.size;
            let same_off_dim = size.len() == rank
                && (0..rank).all(|d| d == dim || size[d] == first.layout.size[d]);
            if !same_off_dim || v.storage.device() != device {
                return None;
            }
            len += size[dim];
        }
        let across: usize = (0..rank)
            .filter(|&d| d != dim)
            .map(|d| first.layout.size[d])
            .product();
        // Only appends to a longer tensor (a sequence growing): a join of
        // like parts (`rotate_half`'s halves, features side by side) stays
        // compact, so reading it whole costs nothing more.
        let appended = len - first.layout.size[dim];
        if across == 0 || appended == 0 || appended >= first.layout.size[dim] {
            return None;
        }
        Some(Plan {
            dim,
            len,
            capacity: bucket(sizes, len)?,
            device,
        })
    }

    /// Joins `views` (cast to `dtype`): the first one's padded value when
    /// it has one, else it padded; then each other one written after it.
    fn join(&self, views: &[View], dtype: DType) -> Result<Padded> {
        let (mut value, mut at) = self.start(&views[0], dtype)?;
        for view in &views[1..] {
            let n = view.layout.size[self.dim];
            if n == 0 {
                continue;
            }
            let part = cast(view.read()?, dtype)?;
            let start = scalar(DType::I64, at as f64, self.device)?;
            let attrs = Attrs::new().with("dim", self.dim);
            value = call1(op!("dynamic_update_slice"), &[value, part, start], &attrs)?;
            at += n;
        }
        Ok(Padded {
            value,
            dim: self.dim,
            len: self.len,
        })
    }

    /// The first input, padded to the capacity, and its length.
    fn start(&self, view: &View, dtype: DType) -> Result<(Tensor, usize)> {
        let held = view
            .storage
            .padded_as(&view.layout)
            .filter(|p| p.dim == self.dim);
        let (value, len) = match held {
            Some(p) => (p.value, p.len),
            None => (view.read()?, view.layout.size[self.dim]),
        };
        let value = cast(value, dtype)?;
        if value.shape().dims()[self.dim] >= self.capacity {
            return Ok((value, len));
        }
        Ok((resized(value, self.dim, self.capacity, 0.0)?, len))
    }
}

/// A padded key, a padded value and their length, as tpu tensors.
type PaddedKeys<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>);

/// Key and value tensors held padded alike along dim -2 (a KV cache), as
/// `(key, value, length)`: the padded values as tpu tensors and the length
/// as a 0-dim int64 tpu tensor; `None` otherwise.
#[pyfunction]
pub fn padded_keys<'py>(
    py: Python<'py>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
) -> PyResult<Option<PaddedKeys<'py>>> {
    let (Some(k), Some(v)) = (held_padded(key)?, held_padded(value)?) else {
        return Ok(None);
    };
    let rank = k.value.shape().rank();
    let alike = rank >= 2
        && k.dim == rank - 2
        && v.dim == k.dim
        && v.len == k.len
        && v.capacity() == k.capacity()
        && v.value.shape().rank() == rank;
    if !alike {
        return Ok(None);
    }
    let Some(device) = tpu_index(&k.value) else {
        return Ok(None);
    };
    let len = scalar(DType::I64, k.len as f64, device)?;
    Ok(Some((
        wrap(py, k.value)?,
        wrap(py, v.value)?,
        wrap(py, len)?,
    )))
}

/// A tpu view in `dtype` (`.to(dtype)`, `clone`) when it views all of a
/// padded storage: the padded value cast, held padded alike, so a mask
/// grown by `cat` stays padded; `None` otherwise.
pub fn padded_copy_of(view: &View, dtype: DType) -> Result<Option<Padded>> {
    if current()?.is_empty() {
        return Ok(None);
    }
    let Some(p) = view.storage.padded_as(&view.layout) else {
        return Ok(None);
    };
    Ok(Some(Padded {
        value: cast(p.value, dtype)?,
        dim: p.dim,
        len: p.len,
    }))
}

/// `constant_pad_nd(t, pad, value)` when `t` views all of a padded storage
/// and `pad` only appends along its padded dim (a mask padded to a static
/// cache's length): read from the padded value, with the elements past the
/// held length set to `value` at run time, so the program is built once per
/// bucket rather than per length. `None` otherwise.
pub fn padded_pad(view: &View, pad: &[i64], value: f64) -> Result<Option<Tensor>> {
    if current()?.is_empty() {
        return Ok(None);
    }
    let Some(p) = view.storage.padded_as(&view.layout) else {
        return Ok(None);
    };
    let rank = p.value.shape().rank();
    // `pad` lists (before, after) pairs from the last dim backwards.
    let after = 2 * (rank - 1 - p.dim) + 1;
    let appends_only = pad.len() % 2 == 0
        && pad.len() <= 2 * rank
        && after < pad.len()
        && pad[after] > 0
        && pad.iter().enumerate().all(|(i, &v)| i == after || v == 0);
    if !appends_only {
        return Ok(None);
    }
    let target = p.len + pad[after] as usize;
    let Some(device) = tpu_index(&p.value) else {
        return Ok(None);
    };
    let base = resized(p.value.clone(), p.dim, target, value)?;
    let mut line = vec![1usize; rank];
    line[p.dim] = target;
    let attrs = Attrs::new()
        .with("shape", line)
        .with("dim", p.dim)
        .with("dtype", DType::I64);
    let index = call(op!("iota"), &[], &attrs, device)?.remove(0);
    let held = call1(
        op!("lt"),
        &[index, scalar(DType::I64, p.len as f64, device)?],
        &Attrs::new(),
    )?;
    let fill = scalar(p.value.dtype(), value, device)?;
    Ok(Some(call1(
        op!("where"),
        &[held, base, fill],
        &Attrs::new(),
    )?))
}

/// `value` cut or grown (with `fill`) to `len` along `dim`.
fn resized(value: Tensor, dim: usize, len: usize, fill: f64) -> Result<Tensor> {
    let have = value.shape().dims()[dim];
    if have == len {
        return Ok(value);
    }
    if have > len {
        let attrs = Attrs::new()
            .with("dim", dim)
            .with("start", 0)
            .with("end", len);
        return call1(op!("slice"), &[value], &attrs);
    }
    // `pad` lists (before, after) pairs from the last dim backwards.
    let rank = value.shape().rank();
    let mut pad = vec![0i64; 2 * (rank - dim)];
    pad[2 * (rank - 1 - dim) + 1] = (len - have) as i64;
    let attrs = Attrs::new().with("pad", pad).with("value", fill);
    call1(op!("pad"), &[value], &attrs)
}

/// The index of the tpu device holding `value`.
fn tpu_index(value: &Tensor) -> Option<usize> {
    match value.device() {
        tpu_core::Device::Tpu(d) => Some(d),
        tpu_core::Device::Cpu => None,
    }
}

/// The padded value of a tpu tensor that views all of a padded storage.
fn held_padded(t: &Bound<'_, PyAny>) -> Result<Option<Padded>> {
    Ok(View::of(t)?.and_then(|view| view.storage.padded_as(&view.layout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_to_sorted_sizes() {
        assert_eq!(parse("128, 64,64").unwrap(), vec![64, 128]);
        assert!(parse("off").unwrap().is_empty());
        assert!(parse("").unwrap().is_empty());
        let pow2 = parse("pow2").unwrap();
        assert_eq!(pow2[..3], [16, 32, 64]);
        assert_eq!(*pow2.last().unwrap(), POW2_LAST);
        for bad in ["-3", "x", "64,,128", "0,64"] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn a_length_takes_the_smallest_bucket_that_holds_it() {
        let sizes = [16, 64];
        assert_eq!(bucket(&sizes, 1), Some(16));
        assert_eq!(bucket(&sizes, 16), Some(16));
        assert_eq!(bucket(&sizes, 17), Some(64));
        assert_eq!(bucket(&sizes, 65), None);
    }
}
