//! `cargo xtask fw`: builds the QEMU firmware, reports its size and checks
//! the runtime's static footprint against its budget.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

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

/// Builds the firmware, prints its path, a size report (`rust-size` from
/// cargo-binutils, which `cargo xtask setup` installs) and its largest
/// statics (`rust-nm`), and fails if the static footprint is over
/// [`FOOTPRINT_BUDGET`].
pub fn fw(root: &Path) -> Result<PathBuf> {
    let elf = build(root)?;
    println!("firmware: {}", elf.display());
    let sections = output(Command::new(SIZE).args(["-A"]).arg(&elf))?;
    print!("{sections}");
    let statics = output(Command::new(NM).args(["-S", "--size-sort", "-C"]).arg(&elf))?;
    println!("largest statics:");
    for line in statics.lines().rev().take(6) {
        println!("  {line}");
    }
    let footprint = footprint(&sections)?;
    println!(
        "static footprint (allocated sections but .stacks): {footprint} bytes = {:.2} MiB, budget {:.0} MiB",
        footprint as f64 / MIB,
        FOOTPRINT_BUDGET as f64 / MIB
    );
    if footprint > FOOTPRINT_BUDGET {
        bail!("the firmware's static footprint, {footprint} bytes, is over its budget of {FOOTPRINT_BUDGET}");
    }
    for name in ZEROED_STATICS {
        check_zeroed(&statics, name)?;
    }
    Ok(elf)
}

/// Statics whose first value is all zeros, so that they take no room in
/// the image (`.bss`, filled at boot) rather than their size in `.data`:
/// the dispatch queues are 827 KiB at the default window. (The
/// orchestrator's first value has sentinels in its TensorMap and slots:
/// it is in `.data`.)
const ZEROED_STATICS: [&str; 1] = ["firmware::QUEUES"];

/// Fails unless `name` is a `.bss` symbol in `rust-nm -S -C` output
/// (`address size type name` lines; type `b` or `B`).
fn check_zeroed(statics: &str, name: &str) -> Result<()> {
    let kind = statics.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields[..] {
            [_, _, kind, symbol] if symbol == name => Some(kind),
            _ => None,
        }
    });
    match kind {
        Some("b" | "B") => Ok(()),
        Some(kind) => bail!(
            "`{name}` is not zero-initialized (symbol type {kind}, not .bss): a nonzero first value puts all of it in the image"
        ),
        None => bail!("no static `{name}` in the firmware's symbols"),
    }
}

/// The most memory the firmware's code and statics may take, its stacks
/// aside (issue: a 4,096-task window in at most 2 MiB).
pub const FOOTPRINT_BUDGET: u64 = 2 << 20;

const MIB: f64 = (1 << 20) as f64;

/// The bytes of every allocated section (a nonzero address) but the
/// stacks, from `rust-size -A` output (`name size address` lines).
fn footprint(sections: &str) -> Result<u64> {
    let mut total = 0;
    for line in sections.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [name, size, addr] = fields[..] else {
            continue;
        };
        let (Ok(size), Ok(addr)) = (size.parse::<u64>(), addr.parse::<u64>()) else {
            continue;
        };
        if addr != 0 && name != ".stacks" {
            total += size;
        }
    }
    if total == 0 {
        bail!("no allocated sections in the size report:\n{sections}");
    }
    Ok(total)
}

/// Runs `cmd` and returns its standard output.
fn output(cmd: &mut Command) -> Result<String> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().with_context(|| {
        format!("the size report needs `{tool}` (cargo-binutils): run `cargo xtask setup`")
    })?;
    if !out.status.success() {
        bail!("{tool} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// cargo-binutils' `llvm-size` and `llvm-nm` from the `llvm-tools` component.
const SIZE: &str = "rust-size";
const NM: &str = "rust-nm";

#[cfg(test)]
mod tests {
    use super::{check_zeroed, footprint};

    #[test]
    fn a_zeroed_static_is_one_in_bss() {
        let nm = "00000000400dcf40 00000000000b5730 d firmware::ORCHESTRATOR\n0000000040192bc0 00000000000c9fc0 b firmware::QUEUES\n";
        assert!(check_zeroed(nm, "firmware::QUEUES").is_ok());
        let err = check_zeroed(nm, "firmware::ORCHESTRATOR").unwrap_err();
        assert!(err.to_string().contains("not zero-initialized"), "{err}");
        assert!(check_zeroed(nm, "firmware::MISSING").is_err());
    }

    #[test]
    fn the_footprint_counts_allocated_sections_but_the_stacks() {
        let report = "firmware  :\nsection size addr\n.text 100 1074266112\n.data 20 1074443584\n.bss 3 1074712704\n.stacks 2097152 1074760528\n.debug_info 540849 0\nTotal 2638124\n";
        assert_eq!(footprint(report).unwrap(), 123);
        assert!(footprint("nothing here").is_err());
    }
}
