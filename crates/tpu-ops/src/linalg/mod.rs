//! Linear algebra: matmul with batching and broadcasting, dot_general, convolutions and pooling.
