//! Neural-network ops: normalisations, losses and attention.
