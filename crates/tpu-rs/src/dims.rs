//! [`Dims`]: the one type every method taking dimensions or a shape
//! accepts: a number, an array, a slice, a vector or a tuple of `usize`,
//! `i64` or `i32` (`x.sum(1, false)`, `x.reshape([2, -1])`,
//! `x.permute((1, 0))`, `x.reshape(y.dims())`).

/// Dimension indices or sizes (negative ones count from the end, or mean
/// "the rest" in a reshape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dims(Vec<i64>);

impl Dims {
    /// The values.
    pub fn as_slice(&self) -> &[i64] {
        &self.0
    }
}

macro_rules! dims_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Dims {
            fn from(d: $t) -> Dims {
                Dims(vec![d as i64])
            }
        }
        impl<const N: usize> From<[$t; N]> for Dims {
            fn from(d: [$t; N]) -> Dims {
                Dims(d.iter().map(|&v| v as i64).collect())
            }
        }
        impl<const N: usize> From<&[$t; N]> for Dims {
            fn from(d: &[$t; N]) -> Dims {
                Dims(d.iter().map(|&v| v as i64).collect())
            }
        }
        impl From<&[$t]> for Dims {
            fn from(d: &[$t]) -> Dims {
                Dims(d.iter().map(|&v| v as i64).collect())
            }
        }
        impl From<Vec<$t>> for Dims {
            fn from(d: Vec<$t>) -> Dims {
                Dims(d.iter().map(|&v| v as i64).collect())
            }
        }
        impl From<&Vec<$t>> for Dims {
            fn from(d: &Vec<$t>) -> Dims {
                Dims(d.iter().map(|&v| v as i64).collect())
            }
        }
        impl From<($t, $t)> for Dims {
            fn from(d: ($t, $t)) -> Dims {
                Dims(vec![d.0 as i64, d.1 as i64])
            }
        }
        impl From<($t, $t, $t)> for Dims {
            fn from(d: ($t, $t, $t)) -> Dims {
                Dims(vec![d.0 as i64, d.1 as i64, d.2 as i64])
            }
        }
        impl From<($t, $t, $t, $t)> for Dims {
            fn from(d: ($t, $t, $t, $t)) -> Dims {
                Dims(vec![d.0 as i64, d.1 as i64, d.2 as i64, d.3 as i64])
            }
        }
    )*};
}

dims_from!(usize, i64, i32);

impl From<()> for Dims {
    fn from((): ()) -> Dims {
        Dims(Vec::new())
    }
}

impl From<&Dims> for Dims {
    fn from(d: &Dims) -> Dims {
        d.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::Dims;

    fn dims(d: impl Into<Dims>) -> Vec<i64> {
        d.into().0
    }

    #[test]
    fn every_spelling_gives_the_same_dims() {
        let want = vec![2, -1];
        assert_eq!(dims([2, -1]), want);
        assert_eq!(dims([2i64, -1]), want);
        assert_eq!(dims((2, -1)), want);
        assert_eq!(dims(vec![2i64, -1]), want);
        assert_eq!(dims(vec![2i32, -1]), want);
        assert_eq!(dims(&[2i64, -1][..]), want);
        assert_eq!(dims([2usize, 3]), vec![2, 3]);
        assert_eq!(dims(&[2usize, 3][..]), vec![2, 3]);
        assert_eq!(dims(1usize), vec![1]);
        assert_eq!(dims(-1), vec![-1]);
        assert_eq!(dims(()), Vec::<i64>::new());
    }
}
