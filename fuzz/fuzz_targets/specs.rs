//! cargo-fuzz entry for [`tpu_rs_fuzz::specs`]; on stable, replays the files given.
#![cfg_attr(fuzzing, no_main)]
tpu_rs_fuzz::target!(specs);
