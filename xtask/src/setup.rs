//! `cargo xtask setup`: installs what the build needs and is missing. Safe to
//! run again: it only acts on what is absent and says what it did.

use std::process::Command;

use anyhow::{Context, Result};

use crate::run;

/// Debian packages: QEMU for the firmware, clang/libclang for the kernels
/// and bindgen; the aarch64 Linux cross compilers and C library that link
/// the AICPU program's shared object (`cargo xtask dist`) and build its
/// launcher, and qemu-user that runs them (`cargo xtask launcher`). (The
/// LLVM binutils come from the `llvm-tools` component, through
/// cargo-binutils.)
const APT_PACKAGES: [&str; 7] = [
    "qemu-system-arm",
    "clang",
    "libclang-dev",
    "qemu-user-static",
    "gcc-aarch64-linux-gnu",
    "g++-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
];
/// `rust-src`: the firmware builds `core` from it (see [`crate::target`]).
const COMPONENTS: [&str; 4] = ["rust-src", "llvm-tools", "rustfmt", "clippy"];

/// Cargo-installed tools: `rust-size` (and `cargo size`/`cargo objcopy`)
/// over the `llvm-tools` component, for the firmware's size report.
const CARGO_TOOLS: [&str; 1] = ["cargo-binutils"];

pub fn setup() -> Result<()> {
    apt()?;
    cargo_tools()?;
    rustup()
}

/// Installs the [`CARGO_TOOLS`] that `cargo install --list` does not list
/// (about a minute each, from source, with their locked dependencies).
fn cargo_tools() -> Result<()> {
    let cargo = || Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let out = cargo()
        .args(["install", "--list"])
        .output()
        .context("running cargo install --list")?;
    anyhow::ensure!(
        out.status.success(),
        "cargo install --list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&out.stdout);
    for tool in CARGO_TOOLS {
        if installed_crate(&listed, tool) {
            eprintln!("setup: cargo tool {tool} present");
        } else {
            run(cargo().args(["install", "--locked", tool]))?;
        }
    }
    Ok(())
}

/// Whether `cargo install --list` output (`name vX.Y.Z:` lines, each
/// followed by its binaries, indented) lists the crate `name`.
fn installed_crate(listed: &str, name: &str) -> bool {
    listed
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .any(|l| l.split_whitespace().next() == Some(name))
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

#[cfg(test)]
mod tests {
    use super::installed_crate;

    #[test]
    fn installed_crates_are_read_from_cargo_install_list() {
        let listed = "cargo-binutils v0.4.0:\n    cargo-size\n    rust-size\ncargo-fuzz v0.13.2:\n    cargo-fuzz\n";
        assert!(installed_crate(listed, "cargo-binutils"));
        assert!(installed_crate(listed, "cargo-fuzz"));
        // A binary is not a crate, and a prefix is not a name.
        assert!(!installed_crate(listed, "cargo-size"));
        assert!(!installed_crate(listed, "cargo"));
        assert!(!installed_crate("", "cargo-binutils"));
    }
}
