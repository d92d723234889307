//! Work to finish before a plugin is torn down at process exit. A loaded
//! plugin registers its C++ destructors with the C runtime when it loads;
//! a thread still inside the plugin when they run (a compile the process
//! no longer waits for) crashes the process. Handlers registered here, after
//! the plugin loaded, run before those destructors (the C runtime runs exit
//! handlers in reverse order of registration).

unsafe extern "C" {
    fn atexit(handler: extern "C" fn()) -> std::ffi::c_int;
}

/// Runs `handler` when the process exits, before the destructors of every
/// plugin loaded so far. False when the C runtime refused it.
pub(crate) fn before_plugin_teardown(handler: extern "C" fn()) -> bool {
    // SAFETY: `atexit` takes any `extern "C" fn()` and only stores it; the
    // handler is a plain Rust function that outlives the process.
    unsafe { atexit(handler) == 0 }
}
