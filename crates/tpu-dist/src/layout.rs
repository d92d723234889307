//! Moving equal blocks of a row-major tensor between "along a dimension"
//! and "one after another": what the host leg needs to gather, scatter and
//! exchange along any dimension when Gloo moves flat bytes.

/// The bytes of a row-major tensor of `dims` (elements of `elem` bytes)
/// viewed as `[outer, dims[dim], inner]`: (outer, bytes of one index of
/// `dim` across the inner dimensions).
fn around(dims: &[usize], dim: usize, elem: usize) -> (usize, usize) {
    let outer = dims[..dim].iter().product();
    let inner: usize = dims[dim + 1..].iter().product();
    (outer, inner * elem)
}

/// Splits `data` (a tensor of `dims`) along `dim` into `n` equal blocks
/// and lays them one after another: block `r` is the `r`-th slice.
pub(crate) fn split(data: &[u8], dims: &[usize], dim: usize, n: usize, elem: usize) -> Vec<u8> {
    let (outer, row) = around(dims, dim, elem);
    let block_rows = dims[dim] / n;
    let chunk = block_rows * row;
    let mut out = Vec::with_capacity(data.len());
    for r in 0..n {
        for o in 0..outer {
            let start = (o * dims[dim] + r * block_rows) * row;
            out.extend_from_slice(&data[start..start + chunk]);
        }
    }
    out
}

/// The inverse of [`split`]: `n` blocks of `block_dims`, one after
/// another, concatenated along `dim`.
pub(crate) fn concat(
    blocks: &[u8],
    block_dims: &[usize],
    dim: usize,
    n: usize,
    elem: usize,
) -> Vec<u8> {
    let (outer, row) = around(block_dims, dim, elem);
    let chunk = block_dims[dim] * row;
    let block_len = outer * chunk;
    let mut out = Vec::with_capacity(blocks.len());
    for o in 0..outer {
        for r in 0..n {
            let start = r * block_len + o * chunk;
            out.extend_from_slice(&blocks[start..start + chunk]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2x6 tensor of one-byte elements 0..12.
    fn sample() -> Vec<u8> {
        (0..12).collect()
    }

    #[test]
    fn split_along_the_last_dim_takes_columns() {
        let blocks = split(&sample(), &[2, 6], 1, 3, 1);
        assert_eq!(blocks, [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]);
    }

    #[test]
    fn split_along_the_first_dim_is_the_identity() {
        assert_eq!(split(&sample(), &[2, 6], 0, 2, 1), sample());
    }

    #[test]
    fn concat_undoes_split_for_every_dim_and_width() {
        let dims = [2, 4, 6];
        for elem in [1, 2, 4] {
            let data: Vec<u8> = (0..48 * elem).map(|i| i as u8).collect();
            for (dim, n) in [(0, 2), (1, 4), (1, 2), (2, 3)] {
                let mut block = dims.to_vec();
                block[dim] /= n;
                let blocks = split(&data, &dims, dim, n, elem);
                assert_eq!(concat(&blocks, &block, dim, n, elem), data, "{dim} {n}");
            }
        }
    }
}
