//! cargo-fuzz entry for [`tpu_rs_fuzz::program_record`]; on stable, replays the files given.
#![cfg_attr(fuzzing, no_main)]
tpu_rs_fuzz::target!(program_record);
