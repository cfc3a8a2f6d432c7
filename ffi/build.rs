//! Compiles the C++ tile kernels (`kernels/src/*.cpp`) into a static library.
//!
//! Bindings are not generated here (see `cargo xtask bindgen`), so the host
//! build needs a C++ compiler but no libclang.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let kernels = manifest.join("../kernels");
    let target = std::env::var("TARGET").expect("set by cargo");
    println!("cargo:rerun-if-changed={}", kernels.display());

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .cpp_link_stdlib(None)
        .include(kernels.join("include"))
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        // Freestanding C++: no runtime support library is linked.
        .flag("-ffreestanding")
        .flag("-fno-exceptions")
        .flag("-fno-rtti")
        .flag("-fno-threadsafe-statics")
        .flag_if_supported("-fno-asynchronous-unwind-tables")
        .flag_if_supported("-fno-stack-protector")
        // Bit-identical f32 results on every target: no FMA contraction, and
        // sqrt is a bare instruction (no errno path calling libm).
        .flag("-ffp-contract=off")
        .flag("-fno-math-errno");
    if target == "aarch64-unknown-none" {
        // Real hardware may run kernels with the MMU off; keep FP enabled.
        build.flag("-mstrict-align");
    }
    for file in kernel_sources(&kernels.join("src")) {
        build.file(file);
    }
    build.compile("wsp_kernels");
}

/// The kernel sources, sorted so the archive is the same on every machine.
fn kernel_sources(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cpp"))
        .collect();
    files.sort();
    files
}
