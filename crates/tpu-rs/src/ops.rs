//! Tensor methods for the registered ops, and operator overloading.
//! Every op is also reachable by name through [`Tensor::apply`].

use std::ops::{Add, Div, Mul, Neg, Sub};

use tpu_core::DType;
use tpu_core::op::Attrs;

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

fn dims_attrs(dims: &[i64], keepdim: bool) -> Attrs {
    Attrs::new().with("dims", dims).with("keepdim", keepdim)
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
    pub fn sum(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        Tensor::apply1("sum", &[self], reduce_attrs(dims, keepdim))
    }

    /// Sum of every element.
    #[track_caller]
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// Mean over `dims` (all when empty).
    #[track_caller]
    pub fn mean(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        Tensor::apply1("mean", &[self], reduce_attrs(dims, keepdim))
    }

    /// Mean of every element.
    #[track_caller]
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// Maximum over `dims`.
    #[track_caller]
    pub fn max(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        Tensor::apply1("max", &[self], reduce_attrs(dims, keepdim))
    }

    /// Minimum over `dims`.
    #[track_caller]
    pub fn min(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
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
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        Tensor::apply1("reshape", &[self], Attrs::new().with("shape", shape))
    }

    /// Broadcast to `shape`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        Tensor::apply1("broadcast_to", &[self], Attrs::new().with("shape", shape))
    }

    /// Permute dimensions.
    #[track_caller]
    pub fn permute(&self, dims: &[i64]) -> Result<Tensor> {
        Tensor::apply1("permute", &[self], Attrs::new().with("dims", dims))
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

fn reduce_attrs(dims: &[i64], keepdim: bool) -> Attrs {
    if dims.is_empty() {
        Attrs::new().with("keepdim", keepdim)
    } else {
        dims_attrs(dims, keepdim)
    }
}

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
                Tensor::apply1($op, &[&self, &rhs], Attrs::new())
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
