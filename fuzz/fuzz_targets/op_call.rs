//! cargo-fuzz entry for [`tpu_rs_fuzz::op_call`]; on stable, replays the files given.
#![cfg_attr(fuzzing, no_main)]
tpu_rs_fuzz::target!(op_call);
