//! Tensor methods for the registered ops, and operator overloading.
//! Every op is also reachable by name through [`Tensor::apply`].

use std::ops::{Add, Div, Mul, Neg, Sub};

use tpu_core::DType;
use tpu_core::op::Attrs;

use crate::dims::Dims;
use crate::error::Result;
use crate::tensor::Tensor;

macro_rules! unary_methods {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("Elementwise `", stringify!($name), "`.")]
        #[track_caller]
        pub fn $name(&self) -> Result<Tensor> {
            Tensor::apply1(stringify!($name), &[self], Attrs::new())
        }
    )*};
}

macro_rules! binary_methods {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("Elementwise `", stringify!($name), "` with broadcasting and type promotion.")]
        #[track_caller]
        pub fn $name(&self, other: &Tensor) -> Result<Tensor> {
            Tensor::apply1(stringify!($name), &[self, other], Attrs::new())
        }
    )*};
}

fn dims_attrs(dims: impl Into<Dims>, keepdim: bool) -> Attrs {
    Attrs::new()
        .with("dims", dims.into().as_slice())
        .with("keepdim", keepdim)
}

impl Tensor {
    unary_methods!(
        neg,
        abs,
        sign,
        exp,
        expm1,
        log,
        log1p,
        sqrt,
        rsqrt,
        reciprocal,
        sin,
        cos,
        tan,
        tanh,
        sigmoid,
        relu,
        silu,
        erf,
        floor,
        ceil,
        round,
        logical_not,
        isnan,
        isinf,
    );
    binary_methods!(
        add,
        sub,
        mul,
        div,
        pow,
        maximum,
        minimum,
        remainder,
        atan2,
        eq,
        ne,
        lt,
        le,
        gt,
        ge,
        logical_and,
        logical_or,
        logical_xor,
        bitwise_and,
        bitwise_or,
        bitwise_xor,
        matmul,
    );

    /// GELU; `tanh` selects the tanh approximation.
    #[track_caller]
    pub fn gelu(&self, tanh: bool) -> Result<Tensor> {
        let mode = if tanh { "tanh" } else { "none" };
        Tensor::apply1("gelu", &[self], Attrs::new().with("approximate", mode))
    }

    /// `self` where `cond` holds, else `other`.
    #[track_caller]
    pub fn where_else(&self, cond: &Tensor, other: &Tensor) -> Result<Tensor> {
        Tensor::apply1("where", &[cond, self, other], Attrs::new())
    }

    /// Clamps into `[min, max]` (either bound optional).
    #[track_caller]
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        let mut attrs = Attrs::new();
        if let Some(m) = min {
            attrs.set("min", m);
        }
        if let Some(m) = max {
            attrs.set("max", m);
        }
        Tensor::apply1("clamp", &[self], attrs)
    }

    /// Converts to `dtype`.
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        Tensor::apply1("cast", &[self], Attrs::new().with("dtype", dtype))
    }

    /// `self * scalar` (the scalar is a rank-0 tensor, so changing it never
    /// recompiles).
    #[track_caller]
    pub fn scale(&self, scalar: f64) -> Result<Tensor> {
        let s = Tensor::scalar(scalar, self.dtype(), self.device())?;
        self.mul(&s)
    }

    /// `self + scalar`.
    #[track_caller]
    pub fn add_scalar(&self, scalar: f64) -> Result<Tensor> {
        let s = Tensor::scalar(scalar, self.dtype(), self.device())?;
        self.add(&s)
    }

    // ---- Reductions. ----

    /// Sum over `dims` (all when empty).
    #[track_caller]
    pub fn sum(&self, dims: impl Into<Dims>, keepdim: bool) -> Result<Tensor> {
        Tensor::apply1("sum", &[self], reduce_attrs(dims, keepdim))
    }

    /// Sum of every element.
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum((), false)
    }

    /// Mean over `dims` (all when empty).
    #[track_caller]
    pub fn mean(&self, dims: impl Into<Dims>, keepdim: bool) -> Result<Tensor> {
        Tensor::apply1("mean", &[self], reduce_attrs(dims, keepdim))
    }

    /// Mean of every element.
    #[track_caller]
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean((), false)
    }

    /// Maximum over `dims`.
    #[track_caller]
    pub fn max(&self, dims: impl Into<Dims>, keepdim: bool) -> Result<Tensor> {
        Tensor::apply1("max", &[self], reduce_attrs(dims, keepdim))
    }

    /// Minimum over `dims`.
    #[track_caller]
    pub fn min(&self, dims: impl Into<Dims>, keepdim: bool) -> Result<Tensor> {
        Tensor::apply1("min", &[self], reduce_attrs(dims, keepdim))
    }

    /// Index of the maximum along `dim`.
    #[track_caller]
    pub fn argmax(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        Tensor::apply1(
            "argmax",
            &[self],
            Attrs::new().with("dim", dim).with("keepdim", keepdim),
        )
    }

    /// Softmax along `dim`.
    #[track_caller]
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        Tensor::apply1("softmax", &[self], Attrs::new().with("dim", dim))
    }

    /// Log-softmax along `dim`.
    #[track_caller]
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        Tensor::apply1("log_softmax", &[self], Attrs::new().with("dim", dim))
    }

    // ---- Movement. ----

    /// Reshape (one `-1` allowed).
    #[track_caller]
    pub fn reshape(&self, shape: impl Into<Dims>) -> Result<Tensor> {
        Tensor::apply1(
            "reshape",
            &[self],
            Attrs::new().with("shape", shape.into().as_slice()),
        )
    }

    /// Broadcast to `shape`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        Tensor::apply1("broadcast_to", &[self], Attrs::new().with("shape", shape))
    }

    /// Permute dimensions.
    #[track_caller]
    pub fn permute(&self, dims: impl Into<Dims>) -> Result<Tensor> {
        Tensor::apply1(
            "permute",
            &[self],
            Attrs::new().with("dims", dims.into().as_slice()),
        )
    }

    /// Swap two dimensions.
    #[track_caller]
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        Tensor::apply1(
            "transpose",
            &[self],
            Attrs::new().with("dim0", dim0).with("dim1", dim1),
        )
    }

    /// Slice `start..end` by `step` along `dim`.
    #[track_caller]
    pub fn slice(&self, dim: i64, start: i64, end: i64, step: i64) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("dim", dim)
            .with("start", start)
            .with("end", end)
            .with("step", step);
        Tensor::apply1("slice", &[self], attrs)
    }

    /// Rows of `self` (an embedding table) picked by integer `indices`.
    #[track_caller]
    pub fn embedding(&self, indices: &Tensor) -> Result<Tensor> {
        Tensor::apply1("embedding", &[self, indices], Attrs::new())
    }

    /// Concatenate along `dim`.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        Tensor::apply1("concat", tensors, Attrs::new().with("dim", dim))
    }
}

fn reduce_attrs(dims: impl Into<Dims>, keepdim: bool) -> Attrs {
    let dims = dims.into();
    if dims.as_slice().is_empty() {
        Attrs::new().with("keepdim", keepdim)
    } else {
        dims_attrs(dims, keepdim)
    }
}

/// `$trait` for every pairing of a tensor (owned or borrowed) with a
/// tensor or an `f64` (on either side): `&a + &b`, `a + b`, `&a + b`,
/// `a + &b`, `&a + 1.0`, `a - 1.0`, `2.0 * &a`, `2.0 * a`.
macro_rules! operator {
    ($trait:ident, $method:ident, $op:literal) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::apply1($op, &[self, rhs], Attrs::new())
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                $trait::$method(&self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                $trait::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                $trait::$method(self, &rhs)
            }
        }
        impl $trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: f64) -> Result<Tensor> {
                let rhs = Tensor::scalar(rhs, self.dtype(), self.device())?;
                Tensor::apply1($op, &[self, &rhs], Attrs::new())
            }
        }
        impl $trait<f64> for Tensor {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: f64) -> Result<Tensor> {
                $trait::$method(&self, rhs)
            }
        }
        impl $trait<&Tensor> for f64 {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                let lhs = Tensor::scalar(self, rhs.dtype(), rhs.device())?;
                Tensor::apply1($op, &[&lhs, rhs], Attrs::new())
            }
        }
        impl $trait<Tensor> for f64 {
            type Output = Result<Tensor>;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                $trait::$method(self, &rhs)
            }
        }
    };
}

operator!(Add, add, "add");
operator!(Sub, sub, "sub");
operator!(Mul, mul, "mul");
operator!(Div, div, "div");

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        Tensor::apply1("neg", &[self], Attrs::new())
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    #[track_caller]
    fn neg(self) -> Result<Tensor> {
        -&self
    }
}

macro_rules! dim_methods {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "` along `dim`.")]
        #[track_caller]
        pub fn $name(&self, dim: i64) -> Result<Tensor> {
            Tensor::apply1(stringify!($name), &[self], Attrs::new().with("dim", dim))
        }
    )*};
}

macro_rules! reduce_methods {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "` over `dims` (all when empty).")]
        #[track_caller]
        pub fn $name(&self, dims: impl Into<Dims>, keepdim: bool) -> Result<Tensor> {
            Tensor::apply1(stringify!($name), &[self], reduce_attrs(dims, keepdim))
        }
    )*};
}

impl Tensor {
    dim_methods!(cumsum, unsqueeze);
    reduce_methods!(prod, any, all, logsumexp);

    /// Variance over `dims` with Bessel's `correction`.
    #[track_caller]
    pub fn var(&self, dims: impl Into<Dims>, correction: i64, keepdim: bool) -> Result<Tensor> {
        Tensor::apply1(
            "var",
            &[self],
            reduce_attrs(dims, keepdim).with("correction", correction),
        )
    }

    /// Standard deviation over `dims` with Bessel's `correction`.
    #[track_caller]
    pub fn std(&self, dims: impl Into<Dims>, correction: i64, keepdim: bool) -> Result<Tensor> {
        Tensor::apply1(
            "std",
            &[self],
            reduce_attrs(dims, keepdim).with("correction", correction),
        )
    }

    /// Index of the minimum along `dim`.
    #[track_caller]
    pub fn argmin(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        Tensor::apply1(
            "argmin",
            &[self],
            Attrs::new().with("dim", dim).with("keepdim", keepdim),
        )
    }

    /// Removes size-1 dims (`dims` empty: all of them).
    #[track_caller]
    pub fn squeeze(&self, dims: impl Into<Dims>) -> Result<Tensor> {
        let dims = dims.into();
        let attrs = if dims.as_slice().is_empty() {
            Attrs::new()
        } else {
            Attrs::new().with("dims", dims.as_slice())
        };
        Tensor::apply1("squeeze", &[self], attrs)
    }

    /// `length` elements from `start` along `dim`.
    #[track_caller]
    pub fn narrow(&self, dim: i64, start: i64, length: i64) -> Result<Tensor> {
        Tensor::apply1(
            "narrow",
            &[self],
            Attrs::new()
                .with("dim", dim)
                .with("start", start)
                .with("length", length),
        )
    }

    /// Index `index` of `dim`, removing it.
    #[track_caller]
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        Tensor::apply1(
            "select",
            &[self],
            Attrs::new().with("dim", dim).with("index", index),
        )
    }

    /// Stacks along a new `dim`.
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        Tensor::apply1("stack", tensors, Attrs::new().with("dim", dim))
    }

    /// Splits along `dim` into pieces of `sizes`.
    #[track_caller]
    pub fn split(&self, dim: i64, sizes: &[i64]) -> Result<Vec<Tensor>> {
        Tensor::apply(
            "split",
            &[self],
            Attrs::new().with("dim", dim).with("sizes", sizes),
        )
    }

    /// Splits along `dim` into `chunks` near-equal pieces.
    #[track_caller]
    pub fn chunk(&self, chunks: i64, dim: i64) -> Result<Vec<Tensor>> {
        Tensor::apply(
            "chunk",
            &[self],
            Attrs::new().with("dim", dim).with("chunks", chunks),
        )
    }

    /// Constant padding, `pad` as `[lo, hi]` pairs from the last dim.
    #[track_caller]
    pub fn pad(&self, pad: &[i64], value: f64) -> Result<Tensor> {
        Tensor::apply1(
            "pad",
            &[self],
            Attrs::new().with("pad", pad).with("value", value),
        )
    }

    /// Reverses along `dims`.
    #[track_caller]
    pub fn flip(&self, dims: impl Into<Dims>) -> Result<Tensor> {
        Tensor::apply1(
            "flip",
            &[self],
            Attrs::new().with("dims", dims.into().as_slice()),
        )
    }

    /// Upper triangle from `diagonal`.
    #[track_caller]
    pub fn triu(&self, diagonal: i64) -> Result<Tensor> {
        Tensor::apply1("triu", &[self], Attrs::new().with("diagonal", diagonal))
    }

    /// Lower triangle up to `diagonal`.
    #[track_caller]
    pub fn tril(&self, diagonal: i64) -> Result<Tensor> {
        Tensor::apply1("tril", &[self], Attrs::new().with("diagonal", diagonal))
    }

    /// `torch.gather` along `dim`.
    #[track_caller]
    pub fn gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        Tensor::apply1("gather", &[self, index], Attrs::new().with("dim", dim))
    }

    /// Entries of `index` along `dim`.
    #[track_caller]
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        Tensor::apply1(
            "index_select",
            &[self, index],
            Attrs::new().with("dim", dim),
        )
    }

    /// Sorted values and their indices along `dim`.
    #[track_caller]
    pub fn sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        let mut out = Tensor::apply(
            "sort",
            &[self],
            Attrs::new().with("dim", dim).with("descending", descending),
        )?;
        let indices = out.pop();
        match (out.pop(), indices) {
            (Some(v), Some(i)) => Ok((v, i)),
            _ => Err(crate::Error::shape("sort", "expected values and indices")),
        }
    }

    /// The `k` largest (or smallest) values and their indices along `dim`.
    #[track_caller]
    pub fn topk(&self, k: i64, dim: i64, largest: bool) -> Result<(Tensor, Tensor)> {
        let mut out = Tensor::apply(
            "topk",
            &[self],
            Attrs::new()
                .with("k", k)
                .with("dim", dim)
                .with("largest", largest),
        )?;
        let indices = out.pop();
        match (out.pop(), indices) {
            (Some(v), Some(i)) => Ok((v, i)),
            _ => Err(crate::Error::shape("topk", "expected values and indices")),
        }
    }

    /// One-hot encoding of integer classes.
    #[track_caller]
    pub fn one_hot(&self, num_classes: i64) -> Result<Tensor> {
        Tensor::apply1(
            "one_hot",
            &[self],
            Attrs::new().with("num_classes", num_classes),
        )
    }
}
