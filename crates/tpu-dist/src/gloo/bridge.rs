//! The C++ boundary to Gloo (native/gloo_bridge.cc). Every function either
//! completes or returns Gloo's exception as an error; none keeps a pointer
//! into the slices it is given past its return.

use super::StoreAdapter;

#[cxx::bridge(namespace = "tpu_dist")]
pub(crate) mod ffi {
    extern "Rust" {
        type StoreAdapter;
        fn set(self: &StoreAdapter, key: &str, value: &[u8]) -> Result<()>;
        fn get(self: &StoreAdapter, key: &str, timeout_ms: u64) -> Result<Vec<u8>>;
    }

    unsafe extern "C++" {
        include!("tpu-dist/native/gloo_bridge.h");

        type GlooContext;

        fn connect(
            rank: i32,
            size: i32,
            hostname: &str,
            store: &StoreAdapter,
            timeout_ms: u64,
        ) -> Result<UniquePtr<GlooContext>>;
        fn all_reduce(
            self: &GlooContext,
            data: &mut [u8],
            dtype: u8,
            op: u8,
            tag: u32,
            timeout_ms: u64,
        ) -> Result<()>;
        fn reduce_scatter(
            self: &GlooContext,
            input: &[u8],
            output: &mut [u8],
            dtype: u8,
            op: u8,
            tag: u32,
            timeout_ms: u64,
        ) -> Result<()>;
        fn all_gather(
            self: &GlooContext,
            input: &[u8],
            output: &mut [u8],
            tag: u32,
            timeout_ms: u64,
        ) -> Result<()>;
        fn broadcast(
            self: &GlooContext,
            data: &mut [u8],
            root: i32,
            tag: u32,
            timeout_ms: u64,
        ) -> Result<()>;
        fn all_to_all(
            self: &GlooContext,
            input: &[u8],
            output: &mut [u8],
            tag: u32,
            timeout_ms: u64,
        ) -> Result<()>;
        fn send(
            self: &GlooContext,
            data: &[u8],
            peer: i32,
            tag: u32,
            timeout_ms: u64,
        ) -> Result<()>;
        fn recv(
            self: &GlooContext,
            data: &mut [u8],
            peer: i32,
            tag: u32,
            timeout_ms: u64,
        ) -> Result<()>;
        fn barrier(self: &GlooContext, tag: u32, timeout_ms: u64) -> Result<()>;
    }
}

// SAFETY: a Gloo context is a set of TCP pairs guarded by their own locks;
// Gloo allows it to be used from any thread. Rust callers serialize the
// collectives on one context (`ProcessGroup` holds it behind a mutex), as
// Gloo requires for matching tags.
unsafe impl Send for ffi::GlooContext {}
// SAFETY: as above; every method takes `&self` and Gloo's pairs lock
// internally.
unsafe impl Sync for ffi::GlooContext {}
