//! Builds the C++ bridge to Gloo, the engine of the cross-process host leg.

fn main() {
    cxx_build::bridge("src/gloo/bridge.rs")
        .file("native/gloo_bridge.cc")
        .std("c++17")
        .compile("tpu_dist_gloo");
    // Debian's libgloo-dev installs the shared library here.
    println!("cargo:rustc-link-search=native=/usr/lib");
    println!("cargo:rustc-link-lib=gloo");
    println!("cargo:rerun-if-changed=native/gloo_bridge.cc");
    println!("cargo:rerun-if-changed=native/gloo_bridge.h");
}
