//! Reductions over any set of dimensions, with `keepdim`.

mod sum;
