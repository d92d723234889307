//! Movement ops: reshaping, broadcasting, permuting, slicing, joining and
//! indexing.

mod common;
mod dynamic;
mod index;
mod join;
mod permute;
mod reshape;
mod scatter;
mod slice;
mod sort;
mod strided;
mod triangle;

pub(crate) use triangle::triangle;
