//! cargo-fuzz entry for [`tpu_rs_fuzz::cache_entry`]; on stable, replays the files given.
#![cfg_attr(fuzzing, no_main)]
tpu_rs_fuzz::target!(cache_entry);
