//! Fuzz targets for every boundary of tpu-rs that takes user data. Each
//! target is a function of raw bytes that returns normally for any input
//! (a value or a typed error) and panics when the property is broken.
//!
//! The same functions run two ways: under cargo-fuzz on nightly (each
//! `fuzz_targets/*.rs` is a libFuzzer entry point), and on stable in the
//! test suite, which replays `corpus/<target>/` and then explores for a
//! bounded time with [`runner`].

mod op_call;
mod parsers;
pub mod runner;

pub use op_call::op_call;
pub use parsers::{cache_entry, checkpoint, program_record, settings, signature, specs};

/// A fuzz target: bytes in, a panic if the property breaks.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus folder and cargo-fuzz binary.
pub const TARGETS: &[(&str, Target)] = &[
    ("signature", signature),
    ("checkpoint", checkpoint),
    ("cache_entry", cache_entry),
    ("program_record", program_record),
    ("specs", specs),
    ("settings", settings),
    ("op_call", op_call),
];

/// Defines a fuzz binary for target `$name`: the libFuzzer entry point
/// under cargo-fuzz, else a `main` that runs each file named on the command
/// line (for reproducing a crash on stable).
#[macro_export]
macro_rules! target {
    ($name:ident) => {
        #[cfg(fuzzing)]
        ::libfuzzer_sys::fuzz_target!(|data: &[u8]| $crate::$name(data));

        #[cfg(not(fuzzing))]
        fn main() {
            for path in std::env::args().skip(1) {
                let data = std::fs::read(&path).expect("reading a fuzz input");
                $crate::$name(&data);
                println!("{path}: ok");
            }
        }
    };
}
