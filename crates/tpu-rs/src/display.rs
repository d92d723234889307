//! Printing like PyTorch: `tensor([[1.0000, 2.0000], ...], device='tpu:0')`,
//! with `...` past 1000 elements.

use std::fmt;

use tpu_core::host::HostData;
use tpu_core::{DType, Device};

use crate::tensor::Tensor;

/// Elements shown at each end of a summarised dimension.
const EDGE: usize = 3;
/// Tensors with more elements are summarised.
const THRESHOLD: usize = 1000;

fn format_value(v: f64, float: bool, dtype: DType) -> String {
    if !float {
        return if dtype == DType::Bool {
            (if v != 0.0 { "True" } else { "False" }).into()
        } else {
            format!("{}", v as i64)
        };
    }
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        (if v > 0.0 { "inf" } else { "-inf" }).into()
    } else {
        format!("{v:.4}")
    }
}

fn write_dim(out: &mut String, values: &[String], dims: &[usize], summarise: bool, indent: usize) {
    let Some((&n, rest)) = dims.split_first() else {
        out.push_str(&values[0]);
        return;
    };
    let stride: usize = rest.iter().product();
    out.push('[');
    let shown: Vec<Option<usize>> = if summarise && n > 2 * EDGE {
        (0..EDGE)
            .map(Some)
            .chain(std::iter::once(None))
            .chain((n - EDGE..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (k, i) in shown.iter().enumerate() {
        if k > 0 {
            out.push(',');
            if rest.is_empty() {
                out.push(' ');
            } else {
                out.push('\n');
                out.push_str(&" ".repeat(indent + 1));
            }
        }
        match i {
            None => out.push_str("..."),
            Some(i) => write_dim(
                out,
                &values[i * stride..(i + 1) * stride],
                rest,
                summarise,
                indent + 1,
            ),
        }
    }
    out.push(']');
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match self.to_host() {
            Ok(h) => h,
            Err(e) => return write!(f, "tensor(<unavailable: {e}>)"),
        };
        let values: Vec<String> = match host.data() {
            // PyTorch's form: `1.0000+2.0000j`.
            HostData::Complex(z) => z
                .iter()
                .map(|v| {
                    let part = self.dtype().real_part();
                    let im = format_value(v.im.abs(), true, part);
                    let sign = if v.im < 0.0 { '-' } else { '+' };
                    format!("{}{sign}{im}j", format_value(v.re, true, part))
                })
                .collect(),
            data => {
                let float = matches!(data, HostData::Float(_));
                host.to_f64()
                    .iter()
                    .map(|&v| format_value(v, float, self.dtype()))
                    .collect()
            }
        };
        let mut body = String::new();
        if self.numel() == 0 {
            body.push_str("[]");
        } else {
            write_dim(&mut body, &values, self.dims(), self.numel() > THRESHOLD, 7);
        }
        write!(f, "tensor({body}")?;
        if let Device::Tpu(n) = self.device() {
            write!(f, ", device='tpu:{n}'")?;
        }
        if !matches!(self.dtype(), DType::F32 | DType::I64 | DType::Bool) {
            write!(f, ", dtype={}", self.dtype())?;
        }
        if self.requires_grad() {
            write!(f, ", requires_grad=True")?;
        }
        write!(f, ")")
    }
}
