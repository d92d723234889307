//! Neural-network ops: normalisations, losses and attention.

mod attention;
mod batch_norm;
mod loss;
mod norm;

#[cfg(test)]
mod tests;
