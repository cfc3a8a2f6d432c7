//! Links the firmware with `linker/qemu-virt.ld` when it is built for the
//! bare-metal target (the only target it supports).

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let script = manifest.join("../../linker/qemu-virt.ld");
    let script = script
        .canonicalize()
        .unwrap_or_else(|e| panic!("linker script {}: {e}", script.display()));
    println!("cargo:rerun-if-changed={}", script.display());
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("TARGET").expect("set by cargo") == "aarch64-unknown-none" {
        println!("cargo:rustc-link-arg-bins=-T{}", script.display());
    }
}
