//! Builds the C++ bridge to Gloo, the engine of the cross-process host leg.
//! Gloo comes from Debian's `libgloo-dev` (headers in /usr/include, the
//! library in /usr/lib), or from `GLOO_DIR` (its `include` and `lib`).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=GLOO_DIR");
    println!("cargo:rerun-if-changed=native/gloo_bridge.cc");
    println!("cargo:rerun-if-changed=native/gloo_bridge.h");
    let root = std::env::var_os("GLOO_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr"));
    let include = root.join("include");
    if !include.join("gloo/allreduce.h").exists() {
        panic!(
            "tpu-dist needs Gloo's headers at {}: install Debian's libgloo-dev \
             (`cargo xtask setup` does), or point GLOO_DIR at a Gloo install",
            include.join("gloo").display()
        );
    }
    let mut build = cxx_build::bridge("src/gloo/bridge.rs");
    build.file("native/gloo_bridge.cc").std("c++17");
    // /usr/include is searched already; naming it again would reorder the
    // system headers.
    if root != std::path::Path::new("/usr") {
        build.include(&include);
        println!(
            "cargo:rustc-link-search=native={}",
            root.join("lib").display()
        );
    }
    build.compile("tpu_dist_gloo");
    println!("cargo:rustc-link-lib=gloo");
}
