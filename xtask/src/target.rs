//! The firmware's target and how cargo builds for it. Shared by xtask and the
//! integration tests (`tests/src/lib.rs` includes this file by path).
//!
//! The package registries this project builds from ship no prebuilt `core`
//! for `aarch64-unknown-none` (rustup reports its `rust-std` component as
//! unavailable), so `core` and `compiler_builtins` are built from the
//! toolchain's own sources (the `rust-src` component) with cargo's
//! `build-std`. That flag is unstable: the pinned stable toolchain accepts it
//! with `RUSTC_BOOTSTRAP=1`, as the Linux kernel builds its Rust code. The
//! sources are the compiler's own, so the `core` built is the one rustup
//! would have shipped. `compiler-builtins-mem` provides `memcpy` and friends,
//! which a bare-metal image has no C library for.

use std::process::Command;

/// The firmware's target triple.
pub const TARGET: &str = "aarch64-unknown-none";

/// The `-Z` flags that build `core` for [`TARGET`] from source.
pub const BUILD_STD: [&str; 2] = [
    "-Zbuild-std=core,compiler_builtins",
    "-Zbuild-std-features=compiler-builtins-mem",
];

/// The firmware's log level (`DEFMT_LOG`) unless the environment sets one.
pub const DEFMT_LOG: &str = "info";

/// Makes `cargo` (a `build`, `clippy` or `run` for [`TARGET`]) build `core`
/// from source: the environment (and the firmware's log level, [`DEFMT_LOG`],
/// unless set), then `--target` and the `-Z` flags.
pub fn for_target(cargo: &mut Command) -> &mut Command {
    if std::env::var_os("DEFMT_LOG").is_none() {
        cargo.env("DEFMT_LOG", DEFMT_LOG);
    }
    cargo
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["--target", TARGET])
        .args(BUILD_STD)
}
