//! The entry signature of a StableHLO module: parameter and result types,
//! and which parameters may be donated. The runtime checks every execution
//! against it, because plugins do not check argument types themselves.

use std::fmt;

use crate::error::{Error, Result};
use crate::{DType, Shape};

/// A ranked tensor type such as `tensor<2x3xf32>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Static shape.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type from its parts.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    fn parse(text: &str) -> Result<TensorType> {
        let inner = text
            .strip_prefix("tensor<")
            .and_then(|t| t.strip_suffix('>'))
            .ok_or_else(|| Error::Signature(format!("`{text}` is not a tensor type")))?;
        // Dims come first, each followed by `x`; the element type is the
        // rest (it may hold an `x` itself: `complex<f32>`).
        let mut dims = Vec::new();
        let mut rest = inner.trim();
        while let Some((dim, tail)) = rest.split_once('x') {
            if dim.is_empty() || !dim.chars().all(|c| c.is_ascii_digit() || c == '?') {
                break;
            }
            let d = dim.parse::<usize>().map_err(|_| {
                Error::Signature(format!(
                    "`{text}` has a dynamic or invalid dimension `{dim}`"
                ))
            })?;
            dims.push(d);
            rest = tail;
        }
        let dtype = DType::from_mlir_name(rest.trim())
            .ok_or_else(|| Error::UnsupportedType(rest.trim().to_string()))?;
        Ok(TensorType::new(dtype, dims))
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// One parameter of `@main`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameter {
    /// Its type.
    pub ty: TensorType,
    /// Marked `jax.buffer_donor` or `tf.aliasing_output`: the executable may
    /// reuse the argument's memory for an output.
    pub donor: bool,
}

/// The signature of a module's `@main`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// The module's name (`module @name`), or `main`.
    pub name: String,
    /// Parameters in order.
    pub parameters: Vec<Parameter>,
    /// Results in order.
    pub results: Vec<TensorType>,
}

impl Signature {
    /// Reads the signature of `@main` from StableHLO text.
    pub fn parse(program: &str) -> Result<Signature> {
        let name = program
            .split_once("module @")
            .and_then(|(_, rest)| rest.split(|c: char| c.is_whitespace() || c == '{').next())
            .filter(|n| !n.is_empty())
            .unwrap_or("main")
            .to_string();
        let start = program
            .find("@main(")
            .ok_or_else(|| Error::Signature("the program has no `@main(` function".into()))?;
        let mut cursor = Cursor {
            text: &program[start + "@main(".len()..],
        };
        let mut parameters = Vec::new();
        loop {
            cursor.skip_ws();
            if cursor.eat(")") {
                break;
            }
            if !parameters.is_empty() && !cursor.eat(",") {
                return Err(Error::Signature("expected `,` between parameters".into()));
            }
            cursor.skip_ws();
            cursor.take_until(':')?;
            cursor.eat(":");
            let ty = TensorType::parse(cursor.take_type()?)?;
            let attrs = cursor.take_attributes()?;
            let donor =
                attrs.contains("jax.buffer_donor = true") || attrs.contains("tf.aliasing_output");
            parameters.push(Parameter { ty, donor });
        }
        cursor.skip_ws();
        if !cursor.eat("->") {
            return Err(Error::Signature(
                "expected `->` after the parameters".into(),
            ));
        }
        cursor.skip_ws();
        let mut results = Vec::new();
        if cursor.eat("(") {
            loop {
                cursor.skip_ws();
                if cursor.eat(")") {
                    break;
                }
                if !results.is_empty() && !cursor.eat(",") {
                    return Err(Error::Signature("expected `,` between results".into()));
                }
                cursor.skip_ws();
                results.push(TensorType::parse(cursor.take_type()?)?);
                cursor.take_attributes()?;
            }
        } else {
            results.push(TensorType::parse(cursor.take_type()?)?);
        }
        Ok(Signature {
            name,
            parameters,
            results,
        })
    }
}

struct Cursor<'a> {
    text: &'a str,
}

impl<'a> Cursor<'a> {
    fn skip_ws(&mut self) {
        self.text = self.text.trim_start();
    }

    fn eat(&mut self, token: &str) -> bool {
        match self.text.strip_prefix(token) {
            Some(rest) => {
                self.text = rest;
                true
            }
            None => false,
        }
    }

    fn take_until(&mut self, c: char) -> Result<&'a str> {
        let end = self
            .text
            .find(c)
            .ok_or_else(|| Error::Signature(format!("expected `{c}`")))?;
        let (head, rest) = self.text.split_at(end);
        self.text = rest;
        Ok(head.trim())
    }

    /// `tensor<...>` with balanced angle brackets.
    fn take_type(&mut self) -> Result<&'a str> {
        self.skip_ws();
        let mut depth = 0usize;
        for (i, c) in self.text.char_indices() {
            match c {
                '<' => depth += 1,
                '>' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        let (ty, rest) = self.text.split_at(i + 1);
                        self.text = rest;
                        return Ok(ty);
                    }
                }
                _ => {}
            }
        }
        Err(Error::Signature("unterminated type".into()))
    }

    /// An optional `{...}` attribute dictionary, returned whole.
    fn take_attributes(&mut self) -> Result<&'a str> {
        self.skip_ws();
        if !self.text.starts_with('{') {
            return Ok("");
        }
        let mut depth = 0usize;
        for (i, c) in self.text.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        let (attrs, rest) = self.text.split_at(i + 1);
                        self.text = rest;
                        return Ok(attrs);
                    }
                }
                _ => {}
            }
        }
        Err(Error::Signature("unterminated attribute dictionary".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_parameters_results_and_donors() {
        let text = r#"module @axpy attributes {mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32> {jax.buffer_donor = true}, %b: tensor<i1>) -> (tensor<2x3xf32> {jax.result_info = ""}, tensor<ui8>) {
    return %arg0 : tensor<2x3xf32>
  }
}"#;
        let sig = Signature::parse(text).unwrap();
        assert_eq!(sig.name, "axpy");
        assert_eq!(sig.parameters.len(), 2);
        assert!(sig.parameters[0].donor && !sig.parameters[1].donor);
        assert_eq!(sig.parameters[0].ty, TensorType::new(DType::F32, [2, 3]));
        assert_eq!(sig.parameters[1].ty, TensorType::new(DType::Bool, []));
        assert_eq!(sig.results[1], TensorType::new(DType::U8, []));
    }

    #[test]
    fn single_unparenthesised_result_and_no_parameters() {
        let sig = Signature::parse("func.func @main() -> tensor<4xi64> {").unwrap();
        assert!(sig.parameters.is_empty());
        assert_eq!(sig.results, vec![TensorType::new(DType::I64, [4])]);
    }

    #[test]
    fn complex_element_types_are_read_whole() {
        let sig = Signature::parse(
            "func.func @main(%a: tensor<2x3xcomplex<f32>>, %b: tensor<complex<f64>>) -> tensor<3xcomplex<f32>> {",
        )
        .unwrap();
        assert_eq!(sig.parameters[0].ty, TensorType::new(DType::C64, [2, 3]));
        assert_eq!(sig.parameters[1].ty, TensorType::new(DType::C128, []));
        assert_eq!(sig.results, vec![TensorType::new(DType::C64, [3])]);
    }

    #[test]
    fn dynamic_shapes_and_missing_main_are_errors() {
        assert!(Signature::parse("func.func @main(%a: tensor<?xf32>) -> tensor<f32>").is_err());
        assert!(Signature::parse("func.func @other() -> tensor<f32>").is_err());
        assert!(matches!(
            Signature::parse("func.func @main(%a: tensor<2xf8E5M2>) -> tensor<f32>"),
            Err(Error::UnsupportedType(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC*") {
            let _ = Signature::parse(&text);
        }

        #[test]
        fn signature_shaped_noise_never_panics(
            text in "(func\\.func @main\\(|%a: |tensor<|[0-9x?]{0,6}|f32|i1|>|\\{|\\}|,|\\)|->|\\(| ){0,24}"
        ) {
            let _ = Signature::parse(&text);
        }
    }
}
