//! `cargo xtask setup`: installs what the build needs and is missing. Safe to
//! run again: it only acts on what is absent and says what it did.

use std::process::Command;

use anyhow::{Context, Result};

use crate::run;

/// Debian packages: QEMU for the firmware, clang/libclang for the kernels
/// and bindgen, llvm for `llvm-size`/`llvm-objcopy`.
const APT_PACKAGES: [&str; 4] = ["qemu-system-arm", "clang", "libclang-dev", "llvm"];
/// `rust-src`: the firmware builds `core` from it (see [`crate::target`]).
const COMPONENTS: [&str; 4] = ["rust-src", "llvm-tools", "rustfmt", "clippy"];

pub fn setup() -> Result<()> {
    apt()?;
    rustup()
}

fn apt() -> Result<()> {
    if Command::new("dpkg-query")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "setup: no dpkg-query (not Debian?); install {} yourself",
            APT_PACKAGES.join(" ")
        );
        return Ok(());
    }
    let missing: Vec<&str> = APT_PACKAGES
        .into_iter()
        .filter(|p| !apt_installed(p))
        .collect();
    if missing.is_empty() {
        eprintln!("setup: apt packages present: {}", APT_PACKAGES.join(" "));
        return Ok(());
    }
    eprintln!("setup: installing apt packages {}", missing.join(" "));
    run(&mut as_root(&["apt-get", "update"]))?;
    let mut install = as_root(&["apt-get", "install", "-y", "--no-install-recommends"]);
    install
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run(&mut install)
}

fn apt_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|out| out.status.success() && out.stdout.starts_with(b"install ok installed"))
}

/// `args` as a command, through `sudo` unless this process runs as root.
fn as_root(args: &[&str]) -> Command {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    let mut cmd = if is_root {
        Command::new(args[0])
    } else {
        Command::new("sudo")
    };
    cmd.args(if is_root { &args[1..] } else { args });
    cmd
}

/// The components, for the toolchain rust-toolchain.toml selects (rustup
/// passes it down to this process in `RUSTUP_TOOLCHAIN`). No rustup target:
/// the firmware builds `core` from `rust-src` ([`crate::target`]).
fn rustup() -> Result<()> {
    // Installed components are listed with the host triple
    // (`clippy-x86_64-unknown-linux-gnu`), except those for any host (`rust-src`).
    let components = installed(&["component", "list", "--installed"])?;
    let missing: Vec<&str> = COMPONENTS
        .into_iter()
        .filter(|c| {
            !components.iter().any(|i| {
                i.strip_prefix(c)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
            })
        })
        .collect();
    if missing.is_empty() {
        eprintln!("setup: rustup components present: {}", COMPONENTS.join(" "));
        return Ok(());
    }
    run(Command::new("rustup")
        .args(["component", "add"])
        .args(&missing))
}

/// The lines `rustup <args>` prints.
fn installed(args: &[&str]) -> Result<Vec<String>> {
    let out = Command::new("rustup")
        .args(args)
        .output()
        .context("running rustup")?;
    anyhow::ensure!(
        out.status.success(),
        "rustup {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}
