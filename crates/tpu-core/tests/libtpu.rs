//! libtpu on a machine without TPU chips must fail fast with a clear error.
//! Its own test binary, so libtpu never shares a process with another plugin.

use std::time::{Duration, Instant};

use tpu_core::pjrt::discovery;
use tpu_core::{Client, ClientOptions, Error, Plugin};

#[test]
fn libtpu_without_a_tpu_says_no_tpu_found_in_seconds() {
    if discovery::tpu_present() {
        eprintln!("this machine has TPU chips; the no-TPU path cannot be exercised");
        return;
    }
    let path = match discovery::resolve_plugin("tpu") {
        Ok(path) => path,
        Err(e) if std::env::var_os("TPU_RS_REQUIRE_LIBTPU").is_none() => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("TPU_RS_REQUIRE_LIBTPU is set but libtpu is missing: {e}"),
    };
    let started = Instant::now();
    let plugin = Plugin::load(&path).expect("libtpu loads without a TPU");
    assert!(plugin.is_libtpu());
    let (major, minor) = plugin.api_version();
    assert!(major == 0 && minor >= 54, "API {major}.{minor}");
    let err = Client::new(plugin, &ClientOptions::default()).unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, Error::NoTpuFound { .. }), "{err}");
    assert!(err.to_string().contains("no TPU found"), "{err}");
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
    eprintln!("libtpu API {major}.{minor}: `{err}` after {elapsed:?}");
}
