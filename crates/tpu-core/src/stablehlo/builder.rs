//! A typed StableHLO builder. Every value carries its type, every op is
//! written in MLIR's generic form (stable across StableHLO versions), and no
//! call site glues program text together.

use std::fmt::Write;

use half::{bf16, f16};

use super::TensorType;
use crate::{DType, Shape};

/// An SSA value in a program being built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    id: usize,
    ty: TensorType,
}

impl Value {
    /// Its type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// Its shape.
    pub fn shape(&self) -> &Shape {
        &self.ty.shape
    }

    /// Its dimensions.
    pub fn dims(&self) -> &[usize] {
        self.ty.shape.dims()
    }

    /// Its rank.
    pub fn rank(&self) -> usize {
        self.ty.shape.rank()
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "%v{}", self.id)
    }
}

/// The MLIR spelling of a tensor type.
pub fn mlir_type(ty: &TensorType) -> String {
    let mut s = String::from("tensor<");
    for d in ty.shape.dims() {
        let _ = write!(s, "{d}x");
    }
    s.push_str(ty.dtype.mlir_name());
    s.push('>');
    s
}

/// An `array<i64: ...>` attribute.
pub fn i64_array(values: impl IntoIterator<Item = impl Into<i64>>) -> String {
    let items: Vec<String> = values.into_iter().map(|v| v.into().to_string()).collect();
    if items.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

/// A bracketed list `[a, b]` as dimension-number attributes spell it.
pub fn dim_list(values: &[usize]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// A scalar literal of `dtype` as MLIR's dense attributes accept it: floats
/// as exact hex bit patterns (so NaN, infinities and -0.0 survive), integers
/// saturated to the dtype's range.
pub fn literal(dtype: DType, value: f64) -> String {
    match dtype {
        DType::F64 => format!("0x{:016X}", value.to_bits()),
        DType::F32 => format!("0x{:08X}", (value as f32).to_bits()),
        DType::F16 => format!("0x{:04X}", f16::from_f64(value).to_bits()),
        DType::BF16 => format!("0x{:04X}", bf16::from_f64(value).to_bits()),
        DType::Bool => (if value != 0.0 { "true" } else { "false" }).to_string(),
        DType::C64 | DType::C128 => {
            let part = dtype.real_part();
            format!("({}, {})", literal(part, value), literal(part, 0.0))
        }
        _ => {
            let (lo, hi) = int_range(dtype);
            format!("{}", (value as i64).clamp(lo, hi))
        }
    }
}

/// The smallest and largest value of an integer dtype.
pub fn int_range(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        DType::U32 => (0, u32::MAX.into()),
        DType::Bool => (0, 1),
        _ => (i64::MIN, i64::MAX),
    }
}

/// The attribute `mhlo.sharding = "<sharding>"`, quotes and backslashes
/// escaped.
fn sharding_attribute(sharding: &str) -> String {
    let escaped = sharding.replace('\\', "\\\\").replace('"', "\\\"");
    format!("mhlo.sharding = \"{escaped}\"")
}

/// Comparison directions of `stablehlo.compare`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Compare {
    fn keyword(self) -> &'static str {
        match self {
            Compare::Eq => "EQ",
            Compare::Ne => "NE",
            Compare::Lt => "LT",
            Compare::Le => "LE",
            Compare::Gt => "GT",
            Compare::Ge => "GE",
        }
    }
}

/// Builds one module with a public `@main`.
pub struct Builder {
    name: String,
    /// Each parameter, and the result its buffer is reused for, if any.
    parameters: Vec<(Value, Option<usize>)>,
    body: String,
    next_id: usize,
    depth: usize,
    /// Replicas the module runs as (`mhlo.num_replicas`), for collectives.
    replicas: Option<usize>,
    /// SPMD partitions of each replica (`mhlo.num_partitions`).
    partitions: Option<usize>,
    /// `mhlo.sharding` of parameters (by value id) and of results (by index).
    parameter_shardings: Vec<(usize, String)>,
    result_shardings: Vec<(usize, String)>,
}

impl Builder {
    /// A new module named `name` (sanitised to an MLIR identifier).
    pub fn new(name: &str) -> Builder {
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Builder {
            name,
            parameters: Vec::new(),
            body: String::new(),
            next_id: 0,
            depth: 2,
            replicas: None,
            partitions: None,
            parameter_shardings: Vec::new(),
            result_shardings: Vec::new(),
        }
    }

    /// Marks the module as running as `n` replicas, one per device, which
    /// cross-replica collectives (`stablehlo.all_reduce`, ...) span.
    pub fn set_replicas(&mut self, n: usize) {
        self.replicas = Some(n);
    }

    /// Marks the module as split into `n` SPMD partitions
    /// (`mhlo.num_partitions`), to compile with as many partitions.
    pub fn set_partitions(&mut self, n: usize) {
        self.partitions = Some(n);
    }

    /// Puts `mhlo.sharding = "<sharding>"` on parameter `param` (XLA's
    /// sharding text, e.g. `{devices=[2,1]0,1}` or `{replicated}`); no-op
    /// for values that are not parameters.
    pub fn set_parameter_sharding(&mut self, param: &Value, sharding: &str) {
        if self.parameters.iter().any(|(v, _)| v.id == param.id) {
            self.parameter_shardings.retain(|(id, _)| *id != param.id);
            self.parameter_shardings
                .push((param.id, sharding_attribute(sharding)));
        }
    }

    /// Puts `mhlo.sharding = "<sharding>"` on result `index` of `@main`.
    pub fn set_result_sharding(&mut self, index: usize, sharding: &str) {
        self.result_shardings.retain(|(i, _)| *i != index);
        self.result_shardings
            .push((index, sharding_attribute(sharding)));
    }

    fn fresh(&mut self, ty: TensorType) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        Value { id, ty }
    }

    /// Adds a parameter of `@main`.
    pub fn parameter(&mut self, ty: TensorType) -> Value {
        let v = self.fresh(ty);
        self.parameters.push((v.clone(), None));
        v
    }

    /// Lets parameter `param`'s buffer be reused for result `output` (which
    /// must have the same type); no-op for values that are not parameters.
    pub fn donate(&mut self, param: &Value, output: usize) {
        if let Some(slot) = self.parameters.iter_mut().find(|(v, _)| v.id == param.id) {
            slot.1 = Some(output);
        }
    }

    /// Adds a parameter whose buffer may be reused for result `output`
    /// (donation).
    pub fn donated_parameter(&mut self, ty: TensorType, output: usize) -> Value {
        let v = self.fresh(ty);
        self.parameters.push((v.clone(), Some(output)));
        v
    }

    fn line(&mut self, text: &str) {
        for _ in 0..self.depth {
            self.body.push_str("  ");
        }
        self.body.push_str(text);
        self.body.push('\n');
    }

    /// Emits any op in generic form: `"name"(operands) ({regions}) {attrs}`.
    /// `attrs` is the inside of the attribute dictionary (may be empty).
    pub fn op(
        &mut self,
        name: &str,
        operands: &[&Value],
        regions: &[String],
        attrs: &str,
        results: Vec<TensorType>,
    ) -> Vec<Value> {
        let outs: Vec<Value> = results.into_iter().map(|t| self.fresh(t)).collect();
        let mut text = String::new();
        if !outs.is_empty() {
            let names: Vec<String> = outs.iter().map(|v| v.to_string()).collect();
            let _ = write!(text, "{} = ", names.join(", "));
        }
        let args: Vec<String> = operands.iter().map(|v| v.to_string()).collect();
        let _ = write!(text, "\"{name}\"({})", args.join(", "));
        if !regions.is_empty() {
            let _ = write!(text, " ({})", regions.join(", "));
        }
        if !attrs.is_empty() {
            let _ = write!(text, " {{{attrs}}}");
        }
        let in_types: Vec<String> = operands.iter().map(|v| mlir_type(&v.ty)).collect();
        let out_types: Vec<String> = outs.iter().map(|v| mlir_type(&v.ty)).collect();
        let _ = write!(text, " : ({}) -> ", in_types.join(", "));
        if out_types.len() == 1 {
            text.push_str(&out_types[0]);
        } else {
            let _ = write!(text, "({})", out_types.join(", "));
        }
        self.line(&text);
        outs
    }

    /// [`Builder::op`] with exactly one result.
    pub fn op1(
        &mut self,
        name: &str,
        operands: &[&Value],
        attrs: &str,
        result: TensorType,
    ) -> Value {
        let mut outs = self.op(name, operands, &[], attrs, vec![result]);
        outs.remove(0)
    }

    /// A region with one block whose arguments have `arg_types`; `body`
    /// returns the values the region yields.
    pub fn region<E>(
        &mut self,
        arg_types: &[TensorType],
        body: impl FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>, E>,
    ) -> Result<String, E> {
        let outer = std::mem::take(&mut self.body);
        let outer_depth = self.depth;
        self.depth = 1;
        let args: Vec<Value> = arg_types.iter().map(|t| self.fresh(t.clone())).collect();
        let result = body(self, &args);
        let inner = std::mem::replace(&mut self.body, outer);
        self.depth = outer_depth;
        let yielded = result?;
        let header: Vec<String> = args
            .iter()
            .map(|a| format!("{a}: {}", mlir_type(&a.ty)))
            .collect();
        let names: Vec<String> = yielded.iter().map(|v| v.to_string()).collect();
        let types: Vec<String> = yielded.iter().map(|v| mlir_type(&v.ty)).collect();
        Ok(format!(
            "{{\n^bb0({}):\n{inner}  \"stablehlo.return\"({}) : ({}) -> ()\n}}",
            header.join(", "),
            names.join(", "),
            types.join(", ")
        ))
    }

    /// `stablehlo.while`: carries `init` through `body` while `cond` (a
    /// scalar boolean of the carried values) holds; gives the final values.
    pub fn while_loop<E>(
        &mut self,
        init: &[&Value],
        cond: impl FnOnce(&mut Builder, &[Value]) -> Result<Value, E>,
        body: impl FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>, E>,
    ) -> Result<Vec<Value>, E> {
        let types: Vec<TensorType> = init.iter().map(|v| v.ty.clone()).collect();
        let cond = self.region(&types, |b, args| Ok(vec![cond(b, args)?]))?;
        let body = self.region(&types, body)?;
        Ok(self.op("stablehlo.while", init, &[cond, body], "", types))
    }

    /// `for i in start..end`, with `end` an `i64` scalar value:
    /// `body(b, i, values)` gives the next values (same types as `init`);
    /// gives the final values.
    pub fn fori_loop(
        &mut self,
        start: i64,
        end: &Value,
        init: &[&Value],
        body: impl FnOnce(&mut Builder, &Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let first = self.int_constant(DType::I64, [], start);
        let carried: Vec<&Value> = [&first, end]
            .into_iter()
            .chain(init.iter().copied())
            .collect();
        let result: Result<Vec<Value>, std::convert::Infallible> = self.while_loop(
            &carried,
            |b, v| Ok(b.compare(Compare::Lt, &v[0], &v[1])),
            |b, v| {
                let one = b.int_constant(DType::I64, [], 1);
                let next = b.binary("stablehlo.add", &v[0], &one);
                let values = body(b, &v[0], &v[2..]);
                Ok([next, v[1].clone()].into_iter().chain(values).collect())
            },
        );
        match result {
            Ok(mut values) => values.split_off(2),
            Err(never) => match never {},
        }
    }

    /// A region computing `op` of two scalars, for reductions and scatters.
    pub fn scalar_region(&mut self, op: &str, dtype: DType) -> String {
        let scalar = TensorType::new(dtype, []);
        let result: Result<String, std::convert::Infallible> = self
            .region(&[scalar.clone(), scalar.clone()], |b, args| {
                Ok(vec![b.op1(op, &[&args[0], &args[1]], "", scalar.clone())])
            });
        match result {
            Ok(text) => text,
            Err(never) => match never {},
        }
    }

    /// Finishes the module; `results` become `@main`'s results.
    pub fn finish(mut self, results: &[Value]) -> String {
        let names: Vec<String> = results.iter().map(|v| v.to_string()).collect();
        let mut types: Vec<String> = results.iter().map(|v| mlir_type(&v.ty)).collect();
        let ret = format!(
            "\"func.return\"({}) : ({}) -> ()",
            names.join(", "),
            types.join(", ")
        );
        self.line(&ret);
        let params: Vec<String> = self
            .parameters
            .iter()
            .map(|(v, alias)| {
                let mut attrs: Vec<String> = Vec::new();
                if let Some(out) = alias {
                    attrs.push(format!("tf.aliasing_output = {out} : i32"));
                }
                if let Some((_, s)) = self.parameter_shardings.iter().find(|(id, _)| *id == v.id) {
                    attrs.push(s.clone());
                }
                if attrs.is_empty() {
                    format!("{v}: {}", mlir_type(&v.ty))
                } else {
                    format!("{v}: {} {{{}}}", mlir_type(&v.ty), attrs.join(", "))
                }
            })
            .collect();
        for (index, sharding) in &self.result_shardings {
            if let Some(ty) = types.get_mut(*index) {
                let _ = write!(ty, " {{{sharding}}}");
            }
        }
        let attributes = match (self.replicas, self.partitions) {
            (None, None) => String::new(),
            (replicas, partitions) => format!(
                " attributes {{mhlo.num_replicas = {} : i32, mhlo.num_partitions = {} : i32}}",
                replicas.unwrap_or(1),
                partitions.unwrap_or(1)
            ),
        };
        format!(
            "module @{}{attributes} {{\n  func.func public @main({}) -> ({}) {{\n{}  }}\n}}\n",
            self.name,
            params.join(", "),
            types.join(", "),
            self.body
        )
    }

    // ---- Typed helpers for the common ops. ----

    /// A splat constant of `value`.
    pub fn constant(&mut self, dtype: DType, shape: impl Into<Shape>, value: f64) -> Value {
        let ty = TensorType::new(dtype, shape);
        let attrs = format!(
            "value = dense<{}> : {}",
            literal(dtype, value),
            mlir_type(&ty)
        );
        self.op1("stablehlo.constant", &[], &attrs, ty)
    }

    /// An integer constant of integer `dtype`, exact over the whole `i64`
    /// range (clamped to the dtype's).
    pub fn int_constant(&mut self, dtype: DType, shape: impl Into<Shape>, value: i64) -> Value {
        let ty = TensorType::new(dtype, shape);
        let (lo, hi) = int_range(dtype);
        let attrs = format!(
            "value = dense<{}> : {}",
            value.clamp(lo, hi),
            mlir_type(&ty)
        );
        self.op1("stablehlo.constant", &[], &attrs, ty)
    }

    /// A constant with the given row-major values.
    pub fn constant_values(
        &mut self,
        dtype: DType,
        shape: impl Into<Shape>,
        values: &[f64],
    ) -> Value {
        let shape = shape.into();
        // A flat literal list has a rank-1 type; reshape afterwards.
        let flat = TensorType::new(dtype, [values.len()]);
        let items: Vec<String> = values.iter().map(|&v| literal(dtype, v)).collect();
        let attrs = format!(
            "value = dense<[{}]> : {}",
            items.join(", "),
            mlir_type(&flat)
        );
        let v = self.op1("stablehlo.constant", &[], &attrs, flat);
        self.reshape(&v, shape.dims())
    }

    /// A same-typed unary op such as `stablehlo.exponential`.
    pub fn unary(&mut self, op: &str, x: &Value) -> Value {
        self.op1(op, &[x], "", x.ty.clone())
    }

    /// A same-typed binary op such as `stablehlo.add` (operands of one type).
    pub fn binary(&mut self, op: &str, a: &Value, b: &Value) -> Value {
        self.op1(op, &[a, b], "", a.ty.clone())
    }

    /// `stablehlo.compare`, giving booleans.
    pub fn compare(&mut self, direction: Compare, a: &Value, b: &Value) -> Value {
        let ty = TensorType::new(DType::Bool, a.shape().clone());
        let compare_type = if a.dtype().is_float() || a.dtype().is_complex() {
            "FLOAT"
        } else if matches!(a.dtype(), DType::U8 | DType::U32 | DType::Bool) {
            "UNSIGNED"
        } else {
            "SIGNED"
        };
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {}>, compare_type = #stablehlo<comparison_type {compare_type}>",
            direction.keyword()
        );
        self.op1("stablehlo.compare", &[a, b], &attrs, ty)
    }

    /// `stablehlo.select`: `pred ? on_true : on_false`, elementwise.
    pub fn select(&mut self, pred: &Value, on_true: &Value, on_false: &Value) -> Value {
        self.op1(
            "stablehlo.select",
            &[pred, on_true, on_false],
            "",
            on_true.ty.clone(),
        )
    }

    /// `stablehlo.convert` to `dtype` (the identity when already `dtype`),
    /// with PyTorch's meaning where `convert` differs: bool is `!= 0`.
    pub fn convert(&mut self, x: &Value, dtype: DType) -> Value {
        if x.dtype() == dtype {
            return x.clone();
        }
        if dtype == DType::Bool {
            // `convert` to i1 truncates; truth is `!= 0` (for a complex
            // number, either part nonzero).
            let zero = self.constant(x.dtype(), x.shape().clone(), 0.0);
            return self.compare(Compare::Ne, x, &zero);
        }
        if x.dtype().is_complex() && !dtype.is_complex() {
            // `convert` defines no complex-to-real conversion; PyTorch's
            // cast keeps the real part.
            let re = self.part("stablehlo.real", x);
            return self.convert(&re, dtype);
        }
        self.op1(
            "stablehlo.convert",
            &[x],
            "",
            TensorType::new(dtype, x.shape().clone()),
        )
    }

    /// `stablehlo.real` or `stablehlo.imag` of a complex `x`: its parts, of
    /// the part type.
    pub fn part(&mut self, op: &str, x: &Value) -> Value {
        let ty = TensorType::new(x.dtype().real_part(), x.shape().clone());
        self.op1(op, &[x], "", ty)
    }

    /// `stablehlo.complex` of two real values of one float type.
    pub fn complex(&mut self, re: &Value, im: &Value) -> Value {
        let dtype = re.dtype().complex_of().unwrap_or(DType::C64);
        let ty = TensorType::new(dtype, re.shape().clone());
        self.op1("stablehlo.complex", &[re, im], "", ty)
    }

    /// `stablehlo.broadcast_in_dim`: operand dim `i` becomes result dim
    /// `dims[i]`.
    pub fn broadcast_in_dim(&mut self, x: &Value, shape: &[usize], dims: &[usize]) -> Value {
        if x.dims() == shape && dims.iter().enumerate().all(|(i, &d)| i == d) {
            return x.clone();
        }
        let attrs = format!(
            "broadcast_dimensions = {}",
            i64_array(dims.iter().map(|&d| d as i64))
        );
        self.op1(
            "stablehlo.broadcast_in_dim",
            &[x],
            &attrs,
            TensorType::new(x.dtype(), shape),
        )
    }

    /// Broadcasts `x` to `shape` by NumPy rules (trailing dims align).
    pub fn broadcast_to(&mut self, x: &Value, shape: &[usize]) -> Value {
        let offset = shape.len() - x.rank();
        let dims: Vec<usize> = (0..x.rank()).map(|i| i + offset).collect();
        self.broadcast_in_dim(x, shape, &dims)
    }

    /// `stablehlo.reshape`.
    pub fn reshape(&mut self, x: &Value, shape: &[usize]) -> Value {
        if x.dims() == shape {
            return x.clone();
        }
        self.op1(
            "stablehlo.reshape",
            &[x],
            "",
            TensorType::new(x.dtype(), shape),
        )
    }

    /// `stablehlo.transpose`: result dim `i` is operand dim `perm[i]`.
    pub fn transpose(&mut self, x: &Value, perm: &[usize]) -> Value {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return x.clone();
        }
        let shape: Vec<usize> = perm.iter().map(|&p| x.dims()[p]).collect();
        let attrs = format!(
            "permutation = {}",
            i64_array(perm.iter().map(|&p| p as i64))
        );
        self.op1(
            "stablehlo.transpose",
            &[x],
            &attrs,
            TensorType::new(x.dtype(), shape),
        )
    }

    /// `stablehlo.slice` with static starts, limits and strides.
    pub fn slice(
        &mut self,
        x: &Value,
        start: &[usize],
        limit: &[usize],
        strides: &[usize],
    ) -> Value {
        let shape: Vec<usize> = (0..x.rank())
            .map(|i| (limit[i].saturating_sub(start[i])).div_ceil(strides[i].max(1)))
            .collect();
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            i64_array(start.iter().map(|&v| v as i64)),
            i64_array(limit.iter().map(|&v| v as i64)),
            i64_array(strides.iter().map(|&v| v as i64))
        );
        self.op1(
            "stablehlo.slice",
            &[x],
            &attrs,
            TensorType::new(x.dtype(), shape),
        )
    }

    /// `stablehlo.concatenate` along `dim`.
    pub fn concatenate(&mut self, xs: &[&Value], dim: usize) -> Value {
        let mut shape = xs[0].dims().to_vec();
        shape[dim] = xs.iter().map(|x| x.dims()[dim]).sum();
        let attrs = format!("dimension = {dim} : i64");
        self.op1(
            "stablehlo.concatenate",
            xs,
            &attrs,
            TensorType::new(xs[0].dtype(), shape),
        )
    }

    /// `stablehlo.pad` with low, high and interior padding (low/high may be
    /// negative to crop).
    pub fn pad(
        &mut self,
        x: &Value,
        value: &Value,
        low: &[i64],
        high: &[i64],
        interior: &[i64],
    ) -> Value {
        let shape: Vec<usize> = (0..x.rank())
            .map(|i| {
                let d = x.dims()[i] as i64;
                let inner = if d > 0 { (d - 1) * interior[i] } else { 0 };
                (d + low[i] + high[i] + inner).max(0) as usize
            })
            .collect();
        let attrs = format!(
            "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
            i64_array(low.iter().copied()),
            i64_array(high.iter().copied()),
            i64_array(interior.iter().copied())
        );
        self.op1(
            "stablehlo.pad",
            &[x, value],
            &attrs,
            TensorType::new(x.dtype(), shape),
        )
    }

    /// `stablehlo.reverse` along `dims`.
    pub fn reverse(&mut self, x: &Value, dims: &[usize]) -> Value {
        if dims.is_empty() {
            return x.clone();
        }
        let attrs = format!("dimensions = {}", i64_array(dims.iter().map(|&d| d as i64)));
        self.op1("stablehlo.reverse", &[x], &attrs, x.ty.clone())
    }

    /// `stablehlo.iota`: values count up along `dim`.
    pub fn iota(&mut self, dtype: DType, shape: &[usize], dim: usize) -> Value {
        let attrs = format!("iota_dimension = {dim} : i64");
        self.op1("stablehlo.iota", &[], &attrs, TensorType::new(dtype, shape))
    }

    /// `stablehlo.dot_general` with batch and contracting dims of each side;
    /// the result is batch dims, then `a`'s free dims, then `b`'s.
    pub fn dot_general(
        &mut self,
        a: &Value,
        b: &Value,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
        dtype: DType,
    ) -> Value {
        let free = |x: &Value, skip: &[&[usize]]| -> Vec<usize> {
            (0..x.rank())
                .filter(|d| !skip.iter().any(|s| s.contains(d)))
                .map(|d| x.dims()[d])
                .collect()
        };
        let mut shape: Vec<usize> = batch.0.iter().map(|&d| a.dims()[d]).collect();
        shape.extend(free(a, &[batch.0, contract.0]));
        shape.extend(free(b, &[batch.1, contract.1]));
        let attrs = format!(
            "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>",
            dim_list(batch.0),
            dim_list(batch.1),
            dim_list(contract.0),
            dim_list(contract.1)
        );
        self.op1(
            "stablehlo.dot_general",
            &[a, b],
            &attrs,
            TensorType::new(dtype, shape),
        )
    }

    /// `stablehlo.reduce` of `x` over `dims` with a scalar op
    /// (`stablehlo.add`, `stablehlo.maximum`, ...) starting from `init`.
    pub fn reduce(&mut self, x: &Value, init: f64, dims: &[usize], op: &str) -> Value {
        let init = self.constant(x.dtype(), [], init);
        let region = self.scalar_region(op, x.dtype());
        let shape: Vec<usize> = (0..x.rank())
            .filter(|d| !dims.contains(d))
            .map(|d| x.dims()[d])
            .collect();
        let attrs = format!("dimensions = {}", i64_array(dims.iter().map(|&d| d as i64)));
        let mut outs = self.op(
            "stablehlo.reduce",
            &[x, &init],
            &[region],
            &attrs,
            vec![TensorType::new(x.dtype(), shape)],
        );
        outs.remove(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stablehlo::Signature;

    #[test]
    fn finished_modules_have_readable_signatures() {
        let mut b = Builder::new("add.two");
        let x = b.parameter(TensorType::new(DType::F32, [2, 3]));
        let y = b.donated_parameter(TensorType::new(DType::F32, [2, 3]), 0);
        let s = b.binary("stablehlo.add", &x, &y);
        let r = b.reduce(&s, 0.0, &[1], "stablehlo.add");
        let text = b.finish(&[s, r]);
        let sig = Signature::parse(&text).unwrap();
        assert_eq!(sig.name, "add_two");
        assert!(sig.parameters[1].donor && !sig.parameters[0].donor);
        assert_eq!(sig.results[1], TensorType::new(DType::F32, [2]));
    }

    #[test]
    fn partitions_and_shardings_are_annotated() {
        let mut b = Builder::new("spmd");
        b.set_partitions(4);
        let x = b.donated_parameter(TensorType::new(DType::F32, [8]), 0);
        let y = b.parameter(TensorType::new(DType::F32, [8]));
        b.set_parameter_sharding(&x, "{devices=[4]0,1,2,3}");
        b.set_result_sharding(0, "{replicated}");
        let s = b.binary("stablehlo.add", &x, &y);
        let text = b.finish(&[s]);
        assert!(text.contains("mhlo.num_replicas = 1 : i32, mhlo.num_partitions = 4 : i32"));
        assert!(text.contains(
            "tensor<8xf32> {tf.aliasing_output = 0 : i32, mhlo.sharding = \"{devices=[4]0,1,2,3}\"}"
        ));
        assert!(text.contains("-> (tensor<8xf32> {mhlo.sharding = \"{replicated}\"})"));
        let sig = Signature::parse(&text).unwrap();
        assert!(sig.parameters[0].donor && !sig.parameters[1].donor);
        assert_eq!(sig.results, vec![TensorType::new(DType::F32, [8])]);
    }

    #[test]
    fn literals_are_exact() {
        assert_eq!(literal(DType::F32, 1.0), "0x3F800000");
        assert_eq!(literal(DType::BF16, -0.0), "0x8000");
        assert_eq!(literal(DType::Bool, 1.0), "true");
        assert_eq!(literal(DType::I32, -3.0), "-3");
        assert_eq!(literal(DType::U8, -1.0), "0");
        assert_eq!(literal(DType::I8, 300.0), "127");
        assert_eq!(i64_array(Vec::<i64>::new()), "array<i64>");
    }
}
