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

/// Builds the firmware, prints its path and a size report.
pub fn fw(root: &Path) -> Result<PathBuf> {
    let elf = build(root)?;
    println!("firmware: {}", elf.display());
    match size_tool() {
        Some(tool) => run(Command::new(tool).arg(&elf))?,
        None => eprintln!(
            "xtask: no llvm-size found (apt llvm or rustup component llvm-tools); no size report"
        ),
    }
    Ok(elf)
}

/// `llvm-size` from PATH (Debian's llvm), else the one in rustup's llvm-tools.
fn size_tool() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("llvm-size"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let sysroot = output(Command::new(&rustc).args(["--print", "sysroot"])).ok()?;
        let host = output(Command::new(&rustc).arg("-vV")).ok()?;
        let host = host.lines().find_map(|l| l.strip_prefix("host: "))?;
        let tool = Path::new(sysroot.trim())
            .join("lib/rustlib")
            .join(host)
            .join("bin/llvm-size");
        tool.is_file().then_some(tool)
    })
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().context("running rustc")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
