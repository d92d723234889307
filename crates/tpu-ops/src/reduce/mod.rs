//! Reductions over any set of dimensions, with `keepdim`, plus the
//! reductions along one dimension that keep the shape (`softmax`,
//! `log_softmax`, `cumsum`, `cummax`, `logcumsumexp`).

mod cumsum;
mod extrema;
pub(crate) mod kit;
mod logic;
mod mean;
mod moments;
mod scan;
mod softmax;
mod sum;

#[cfg(test)]
pub(crate) mod tests;
