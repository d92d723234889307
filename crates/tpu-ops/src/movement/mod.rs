//! Movement ops: reshaping, broadcasting, permuting, slicing, joining and
//! indexing.

mod reshape;
