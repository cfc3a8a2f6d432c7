//! `cargo xtask fw`: builds the QEMU firmware and reports its size.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::target::{self, TARGET};
use crate::{cargo, run};

/// The release firmware ELF (`CARGO_TARGET_DIR` is honoured).
pub fn elf_path(root: &Path) -> PathBuf {
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |d| root.join(d));
    target_dir.join(TARGET).join("release").join("firmware")
}

/// Builds the firmware (cargo rebuilds only what changed) and returns its path.
pub fn build(root: &Path) -> Result<PathBuf> {
    run(target::for_target(cargo(root).args([
        "build",
        "-p",
        "firmware",
        "--release",
    ])))?;
    Ok(elf_path(root))
}

/// Builds the firmware, prints its path and a size report (`rust-size`
/// from cargo-binutils, which `cargo xtask setup` installs).
pub fn fw(root: &Path) -> Result<PathBuf> {
    let elf = build(root)?;
    println!("firmware: {}", elf.display());
    run(Command::new(SIZE).args(["-A", "-x"]).arg(&elf)).with_context(|| {
        format!("the size report needs `{SIZE}` (cargo-binutils): run `cargo xtask setup`")
    })?;
    Ok(elf)
}

/// cargo-binutils' `llvm-size` from the `llvm-tools` component.
const SIZE: &str = "rust-size";
