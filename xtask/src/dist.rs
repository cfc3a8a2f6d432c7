//! `cargo xtask dist [--out DIR]`: the device artifacts in one folder:
//!
//! - `firmware.elf`, `firmware.bin`: the QEMU firmware and its raw image
//!   (`rust-objcopy -O binary`, from cargo-binutils).
//! - `libwsp_aicpu.so`: the AICPU program. The `aicpu` crate is built as a
//!   staticlib for `aarch64-unknown-none` with `-C relocation-model=pic`
//!   (and the C++ kernels with `-fPIC`), `core` built from source as for
//!   the firmware ([`crate::target`]), in its own target directory
//!   (`target/aicpu`: other flags than the firmware's), then linked with
//!   `aarch64-linux-gnu-gcc -shared -Wl,--whole-archive ... -Wl,--version-script=aicpu/exports.map
//!   -Wl,-z,defs,-z,text -Wl,--gc-sections -lc`.
//!   Its debug information is split off into `libwsp_aicpu.so.debug`
//!   ([`split_debug`]), which the `.so` names in its `.gnu_debuglink`.
//! - `wsp_aicpu.h`: the C header (the checked-in one; `dist` fails when it
//!   is stale, as `cargo xtask header --check` does).
//! - `manifest.json`: each file's name, size and sha256, the crate
//!   version, the rustc version and the git commit.
//!
//! [`check_so`] reads the shared object's ELF and fails unless its dynamic
//! exports are exactly the two entry points, it has no text relocations
//! and it imports only the symbols of [`ALLOWED_IMPORTS`]; it lists the
//! GLIBC versions those need.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use object::read::elf::{Dyn, ElfFile64, FileHeader, SectionHeader};
use object::{elf, Endianness, Object, ObjectSymbol};
use sha2::{Digest, Sha256};

use crate::target::{BUILD_STD, TARGET};
use crate::{cargo, command_line, run};

/// The entry points CANN calls: the only dynamic exports.
pub const EXPORTS: [&str; 2] = [
    "DynTileFwkBackendKernelServerInit",
    "DynTileFwkBackendKernelServer",
];

/// Symbols the shared object may import (from glibc): `abort` (the panic
/// handler), and the weak references of gcc's `crtbeginS.o`, which the
/// loader resolves to null when absent.
pub const ALLOWED_IMPORTS: [&str; 5] = [
    "abort",
    "__cxa_finalize",
    "_ITM_deregisterTMCloneTable",
    "_ITM_registerTMCloneTable",
    "__gmon_start__",
];

/// The cross linker (Debian's `gcc-aarch64-linux-gnu`).
const LINKER: &str = "aarch64-linux-gnu-gcc";
/// The AICPU program's target directory, under the workspace's.
const AICPU_TARGET_DIR: &str = "target/aicpu";

/// What [`check_so`] found.
#[derive(Debug, Default)]
pub struct SoReport {
    /// Defined dynamic symbols.
    pub exports: Vec<String>,
    /// Undefined dynamic symbols, with the version each needs (if any).
    pub imports: Vec<(String, Option<String>)>,
    /// The versions the object needs, per library (`libc.so.6: GLIBC_2.17`).
    pub needed_versions: Vec<String>,
}

/// Builds every artifact into `out` and checks the shared object.
pub fn dist(root: &Path, out: &Path) -> Result<()> {
    crate::header::header(root, true)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let elf = crate::fw::build(root)?;
    copy(&elf, &out.join("firmware.elf"))?;
    run(Command::new("rust-objcopy")
        .args(["-O", "binary"])
        .arg(&elf)
        .arg(out.join("firmware.bin")))
    .context("firmware.bin needs rust-objcopy (cargo-binutils): run `cargo xtask setup`")?;
    let so = out.join("libwsp_aicpu.so");
    build_so(root, &so)?;
    split_debug(&so, &out.join(SO_DEBUG))?;
    let report =
        check_so(&std::fs::read(&so).with_context(|| format!("reading {}", so.display()))?)?;
    eprintln!("libwsp_aicpu.so: exports {:?}", report.exports);
    for (name, version) in &report.imports {
        eprintln!(
            "  imports {name}{}",
            version
                .as_deref()
                .map(|v| format!("@{v}"))
                .unwrap_or_default()
        );
    }
    eprintln!("  needs {}", report.needed_versions.join(", "));
    copy(&root.join(crate::header::HEADER), &out.join("wsp_aicpu.h"))?;
    let manifest = manifest(
        root,
        out,
        &[
            "firmware.elf",
            "firmware.bin",
            "libwsp_aicpu.so",
            SO_DEBUG,
            "wsp_aicpu.h",
        ],
    )?;
    std::fs::write(out.join("manifest.json"), manifest).context("writing manifest.json")?;
    println!("dist: {}", out.display());
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// `cargo <subcommand> -p wsp-aicpu` for the device: `aarch64-unknown-none`,
/// PIC (the C++ kernels too), `core` from source, release, in its own
/// target directory.
pub fn aicpu_cargo(root: &Path, subcommand: &str) -> Command {
    let mut cmd = cargo(root);
    cmd.env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", "-C relocation-model=pic")
        // The C++ kernels of wsp-ffi end up in the archive too.
        .env("CFLAGS_aarch64_unknown_none", "-fPIC")
        .env("CXXFLAGS_aarch64_unknown_none", "-fPIC")
        .args([
            subcommand,
            "-p",
            "wsp-aicpu",
            "--release",
            "--target",
            TARGET,
        ])
        .args(BUILD_STD)
        .arg("--target-dir")
        .arg(root.join(AICPU_TARGET_DIR));
    cmd
}

/// Builds the staticlib and links it into `so`.
pub fn build_so(root: &Path, so: &Path) -> Result<()> {
    let target_dir = root.join(AICPU_TARGET_DIR);
    let mut build = aicpu_cargo(root, "build");
    run(&mut build)?;
    let archive = target_dir
        .join(TARGET)
        .join("release")
        .join("libwsp_aicpu.a");
    let map = root.join("aicpu/exports.map");
    let mut link = Command::new(LINKER);
    link.args(["-shared", "-o"])
        .arg(so)
        .arg("-Wl,--whole-archive")
        .arg(&archive)
        .arg("-Wl,--no-whole-archive")
        .arg(format!("-Wl,--version-script={}", map.display()))
        .args(["-Wl,-z,defs,-z,text", "-Wl,--gc-sections", "-lc"]);
    run(&mut link).with_context(|| {
        format!("linking needs {LINKER} (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross): run `cargo xtask setup`")
    })
}

/// The shared object's debug information, split off: the device loads a
/// `.so` without it (about half the size), and a debugger finds this file
/// by the `.gnu_debuglink` section the `.so` keeps.
pub const SO_DEBUG: &str = "libwsp_aicpu.so.debug";

/// Moves `so`'s debug sections to `debug` and links the two
/// (`rust-objcopy --only-keep-debug`, `--strip-debug --add-gnu-debuglink`).
pub fn split_debug(so: &Path, debug: &Path) -> Result<()> {
    let hint = "splitting debug info needs rust-objcopy (cargo-binutils): run `cargo xtask setup`";
    run(Command::new("rust-objcopy")
        .arg("--only-keep-debug")
        .arg(so)
        .arg(debug))
    .context(hint)?;
    run(Command::new("rust-objcopy")
        .arg("--strip-debug")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(so))
    .context(hint)
}

/// Checks a shared object's dynamic symbols and relocations (see the
/// module docs); what it found, or why it is refused.
pub fn check_so(data: &[u8]) -> Result<SoReport> {
    let file =
        ElfFile64::<Endianness>::parse(data).context("libwsp_aicpu.so is not a 64-bit ELF")?;
    let endian = file.endian();
    if file.elf_header().e_machine(endian) != elf::EM_AARCH64 {
        bail!("libwsp_aicpu.so is not an aarch64 object");
    }
    let sections = file.elf_section_table();
    let versions = sections
        .versions(endian, data)
        .context("reading symbol versions")?;
    let mut report = SoReport::default();
    for sym in file.dynamic_symbols() {
        let name = sym.name().context("a dynamic symbol's name")?.to_string();
        if name.is_empty() {
            continue;
        }
        if sym.is_undefined() {
            let version = match &versions {
                Some(v) => v
                    .version(v.version_index(endian, sym.index()))?
                    .map(|v| String::from_utf8_lossy(v.name()).into_owned()),
                None => None,
            };
            report.imports.push((name, version));
        } else if sym.is_global() {
            report.exports.push(name);
        }
    }
    let mut textrel = false;
    for section in sections.iter() {
        if let Some((entries, _)) = section.dynamic(endian, data)? {
            for entry in entries {
                let tag = entry.d_tag(endian) as u32;
                let value = entry.d_val(endian);
                textrel |= tag == elf::DT_TEXTREL
                    || (tag == elf::DT_FLAGS && value & u64::from(elf::DF_TEXTREL) != 0);
            }
        }
    }
    for section in sections.iter() {
        if let Some((mut needs, link)) = section.gnu_verneed(endian, data)? {
            let strings = sections.strings(endian, data, link)?;
            while let Some((need, mut auxs)) = needs.next()? {
                let lib = String::from_utf8_lossy(need.file(endian, strings)?).into_owned();
                while let Some(aux) = auxs.next()? {
                    let version = String::from_utf8_lossy(aux.name(endian, strings)?).into_owned();
                    report.needed_versions.push(format!("{lib}: {version}"));
                }
            }
        }
    }
    let mut problems = Vec::new();
    let mut exports = report.exports.clone();
    exports.sort();
    let mut wanted: Vec<String> = EXPORTS.iter().map(|s| s.to_string()).collect();
    wanted.sort();
    if exports != wanted {
        problems.push(format!(
            "dynamic exports are {exports:?}, not exactly {wanted:?}"
        ));
    }
    if textrel {
        problems.push(
            "it has text relocations (TEXTREL): build the crate with -C relocation-model=pic"
                .into(),
        );
    }
    for (name, _) in &report.imports {
        if !ALLOWED_IMPORTS.contains(&name.as_str()) {
            problems.push(format!(
                "it imports `{name}`, which is not in the allow-list {ALLOWED_IMPORTS:?}"
            ));
        }
    }
    if !problems.is_empty() {
        bail!("libwsp_aicpu.so is refused:\n  {}", problems.join("\n  "));
    }
    Ok(report)
}

/// `manifest.json` for `files` in `out`.
fn manifest(root: &Path, out: &Path, files: &[&str]) -> Result<String> {
    let mut entries = Vec::new();
    for name in files {
        let bytes = std::fs::read(out.join(name)).with_context(|| format!("reading {name}"))?;
        let digest = Sha256::digest(&bytes);
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        entries.push(serde_json::json!({ "name": name, "size": bytes.len(), "sha256": hex }));
    }
    let doc = serde_json::json!({
        "crate_version": env!("CARGO_PKG_VERSION"),
        "rustc": tool_output(Command::new("rustc").arg("-V").current_dir(root))?,
        "git_commit": git_commit(root)?,
        "files": entries,
    });
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}

/// The commit checked out, with `-dirty` when the tree has changes.
fn git_commit(root: &Path) -> Result<String> {
    let head = tool_output(
        Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(root),
    )?;
    let status = tool_output(
        Command::new("git")
            .args(["status", "--porcelain"])
            .current_dir(root),
    )?;
    Ok(if status.is_empty() {
        head
    } else {
        format!("{head}-dirty")
    })
}

fn tool_output(cmd: &mut Command) -> Result<String> {
    let line = command_line(cmd);
    let out = cmd.output().with_context(|| format!("starting {line}"))?;
    if !out.status.success() {
        bail!("`{line}` failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// The default output folder.
pub fn default_out(root: &Path) -> PathBuf {
    root.join("target").join("dist")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared object built by the cross gcc from `c` with `flags`.
    fn cross_so(name: &str, c: &str, flags: &[&str]) -> Vec<u8> {
        let dir = std::env::temp_dir().join(format!("wsp-dist-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, so) = (dir.join("x.c"), dir.join("x.so"));
        std::fs::write(&src, c).unwrap();
        let status = Command::new(LINKER)
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&src)
            .args(flags)
            .status()
            .expect("the cross gcc (cargo xtask setup installs it)");
        assert!(status.success());
        let bytes = std::fs::read(&so).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        bytes
    }

    const ENTRIES: &str = "int DynTileFwkBackendKernelServerInit(void *a) { return a != 0; }\n\
                           int DynTileFwkBackendKernelServer(void *a) { return a != 0; }\n";

    #[test]
    fn the_two_entry_points_and_allowed_imports_pass() {
        let c = format!("#include <stdlib.h>\n{ENTRIES}void helper(void) {{ abort(); }}\n");
        let map = Path::new(env!("CARGO_MANIFEST_DIR")).join("../aicpu/exports.map");
        let so = cross_so(
            "good",
            &c,
            &[&format!("-Wl,--version-script={}", map.display())],
        );
        let report = check_so(&so).unwrap();
        assert_eq!(report.exports.len(), 2);
        assert!(report
            .imports
            .iter()
            .any(|(n, v)| n == "abort" && v.as_deref() == Some("GLIBC_2.17")));
        assert!(report
            .needed_versions
            .iter()
            .any(|v| v == "libc.so.6: GLIBC_2.17"));
    }

    #[test]
    fn an_extra_export_and_a_foreign_import_are_refused() {
        let c = format!("#include <stdio.h>\n{ENTRIES}void extra(void) {{ puts(\"x\"); }}\n");
        let e = check_so(&cross_so("bad", &c, &[])).unwrap_err().to_string();
        assert!(e.contains("not exactly"), "{e}");
        assert!(e.contains("extra"), "{e}");
        assert!(e.contains("imports `puts`"), "{e}");
    }

    /// Section names of an ELF file.
    fn sections(bytes: &[u8]) -> Vec<String> {
        use object::ObjectSection;
        let file = object::File::parse(bytes).unwrap();
        file.sections()
            .map(|s| s.name().unwrap().to_string())
            .collect()
    }

    #[test]
    fn debug_info_moves_to_its_own_file() {
        let so_bytes = cross_so("debug", ENTRIES, &["-g"]);
        assert!(sections(&so_bytes).iter().any(|s| s == ".debug_info"));
        let dir = std::env::temp_dir().join(format!("wsp-dist-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (so, debug) = (dir.join("x.so"), dir.join("x.so.debug"));
        std::fs::write(&so, &so_bytes).unwrap();
        split_debug(&so, &debug).unwrap();
        let (stripped, kept) = (std::fs::read(&so).unwrap(), std::fs::read(&debug).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        let names = sections(&stripped);
        assert!(!names.iter().any(|s| s.starts_with(".debug")), "{names:?}");
        assert!(names.iter().any(|s| s == ".gnu_debuglink"), "{names:?}");
        assert!(sections(&kept).iter().any(|s| s == ".debug_info"));
        assert!(stripped.len() < so_bytes.len());
        // The stripped object still passes the checks.
        check_so(&stripped).unwrap();
    }

    #[test]
    fn a_host_object_is_refused() {
        let e = check_so(b"not an elf").unwrap_err().to_string();
        assert!(e.contains("not a 64-bit ELF"), "{e}");
    }
}
