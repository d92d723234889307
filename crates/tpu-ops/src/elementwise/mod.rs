//! Elementwise ops: unary math, binary arithmetic with broadcasting and type
//! promotion, comparisons, logic, `where`, `clamp` and `cast`.

mod binary;
mod compare;
mod logic;
mod select;
mod unary;
