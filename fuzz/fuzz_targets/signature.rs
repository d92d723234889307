//! Reading a StableHLO entry signature from arbitrary text never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tpu_core::stablehlo::Signature;

fuzz_target!(|text: &str| {
    let _ = Signature::parse(text);
});
