//! `cargo xtask launcher`: runs a descriptor table through the AICPU shared
//! object (`libwsp_aicpu.so`) the way CANN's launch flow would, without
//! hardware: the C launcher in `launcher/` (built here for aarch64 Linux
//! with the project's C++ kernels linked in) dlopens the `.so`, calls its
//! entry points on AICPU threads and emulates the AICores on threads of its
//! own, all under `qemu-aarch64-static` (Debian's `qemu-user-static`).
//!
//! The build goes to `<target>/launcher/`: the `.so` (from the aicpu dist
//! step), the kernels' objects and the `wsp-launcher` executable, compiled
//! against the checked-in `aicpu/include/wsp_aicpu.h`. Integration tests find that directory in `WSP_LAUNCHER`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::run;

/// The aarch64 Linux C compiler (Debian `gcc-aarch64-linux-gnu`).
pub const CC: &str = "aarch64-linux-gnu-gcc";
/// The aarch64 Linux C++ compiler (Debian `g++-aarch64-linux-gnu`).
pub const CXX: &str = "aarch64-linux-gnu-g++";
/// The user-mode emulator (Debian `qemu-user-static`).
pub const QEMU_USER: &str = "qemu-aarch64-static";
/// The aarch64 sysroot for the dynamic loader and glibc (Debian
/// `libc6-dev-arm64-cross`).
pub const SYSROOT: &str = "/usr/aarch64-linux-gnu";
/// The launcher executable's name in the build directory.
pub const EXE: &str = "wsp-launcher";
/// The shared object's name in the build directory.
pub const SO: &str = "libwsp_aicpu.so";
/// A minimal AICPU program (`launcher/fake_aicpu.c`) in the build
/// directory, for testing the launcher on its own.
pub const FAKE_SO: &str = "libfake_aicpu.so";

/// The flags `ffi/build.rs` compiles the kernels with for the host shim
/// (the ones that decide results: the language, the optimisation level, no
/// FMA contraction, sqrt without errno), so that the launcher's kernels
/// compute bit for bit what the shim's do.
pub const KERNEL_FLAGS: [&str; 10] = [
    "-std=c++17",
    "-O2",
    "-ffreestanding",
    "-fno-exceptions",
    "-fno-rtti",
    "-fno-threadsafe-statics",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-asynchronous-unwind-tables",
    "-fno-stack-protector",
];

/// The launcher's own C flags.
pub const LAUNCHER_FLAGS: [&str; 6] =
    ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"];

/// The build directory: `<target>/launcher` (`CARGO_TARGET_DIR` is honoured).
pub fn dir(root: &Path) -> PathBuf {
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |d| root.join(d));
    target_dir.join("launcher")
}

/// Builds the AICPU program ([`SO`], by the dist step's
/// [`crate::dist::build_so`], checked by [`crate::dist::check_so`]), the
/// kernels, the launcher and the minimal AICPU program ([`FAKE_SO`]) into
/// [`dir`] and returns it.
pub fn build(root: &Path) -> Result<PathBuf> {
    let out = dir(root);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let so = out.join(SO);
    crate::dist::build_so(root, &so)?;
    let elf = std::fs::read(&so).with_context(|| format!("reading {}", so.display()))?;
    crate::dist::check_so(&elf)?;
    let include = |cmd: &mut Command| {
        cmd.arg("-I")
            .arg(root.join("kernels/include"))
            .arg("-I")
            .arg(root.join("aicpu/include"));
    };
    let mut fake = Command::new(CC);
    fake.args(LAUNCHER_FLAGS).args(["-fPIC", "-shared"]);
    include(&mut fake);
    run(fake
        .arg(root.join("launcher/fake_aicpu.c"))
        .arg("-o")
        .arg(out.join(FAKE_SO)))?;
    let objects = kernels(root, &out.join("obj"))?;
    let exe = out.join(EXE);
    let mut cc = Command::new(CC);
    cc.args(LAUNCHER_FLAGS);
    include(&mut cc);
    cc.arg(root.join("launcher/launcher.c"))
        .args(&objects)
        .args(["-ldl", "-o"])
        .arg(&exe);
    run(&mut cc)?;
    Ok(out)
}

/// Compiles every `kernels/src/*.cpp` to an object in `obj` with
/// [`KERNEL_FLAGS`], skipping objects newer than their source and every
/// kernel header when the flags are those of the last build (recorded in
/// `obj/flags`), and returns the objects in source order.
fn kernels(root: &Path, obj: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(obj).with_context(|| format!("creating {}", obj.display()))?;
    let include = root.join("kernels/include");
    let stamp = obj.join("flags");
    let flags = format!("{CXX} {}\n", KERNEL_FLAGS.join(" "));
    let same_flags = std::fs::read_to_string(&stamp).is_ok_and(|f| f == flags);
    // Other flags: every object is out of date.
    let headers = if same_flags {
        newest(&include)?
    } else {
        std::time::SystemTime::now()
    };
    let mut sources: Vec<PathBuf> = std::fs::read_dir(root.join("kernels/src"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    sources.retain(|p| p.extension().is_some_and(|e| e == "cpp"));
    sources.sort();
    let mut objects = Vec::new();
    for source in sources {
        let stem = source.file_stem().expect("a .cpp file has a stem");
        let object = obj.join(stem).with_extension("o");
        let built = modified(&object).ok();
        if built.is_none_or(|b| b < modified(&source).unwrap_or(b) || b < headers) {
            run(Command::new(CXX)
                .args(KERNEL_FLAGS)
                .args(["-Wall", "-Wextra", "-c", "-I"])
                .arg(&include)
                .arg(&source)
                .arg("-o")
                .arg(&object))?;
        }
        objects.push(object);
    }
    std::fs::write(&stamp, flags).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(objects)
}

fn modified(path: &Path) -> Result<std::time::SystemTime> {
    Ok(std::fs::metadata(path)?.modified()?)
}

/// The newest modification time of the files in `dir`.
fn newest(dir: &Path) -> Result<std::time::SystemTime> {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        newest = newest.max(modified(&entry?.path())?);
    }
    Ok(newest)
}

/// The command that runs the launcher in `dir` with the AICPU program
/// `so` on `table` and `arena`, writing the arena to `out`, with `options`
/// (`--threads N`, `--fault ...`, see `launcher/README.md`) after them.
pub fn command(
    dir: &Path,
    so: &Path,
    table: &Path,
    arena: &Path,
    out: &Path,
    options: &[String],
) -> Command {
    let mut cmd = Command::new(QEMU_USER);
    cmd.args(["-L", SYSROOT])
        .arg(dir.join(EXE))
        .arg(so)
        .arg(table)
        .arg(arena)
        .arg(out)
        .args(options);
    cmd
}

/// `cargo xtask launcher`: builds everything, then runs `table` (unless
/// only building) with the launch block `launch` (if any) and returns the
/// launcher's exit status.
pub fn launcher(
    root: &Path,
    table: Option<&Path>,
    arena: Option<&Path>,
    out: Option<&Path>,
    launch: Option<&[u8]>,
    options: &[String],
) -> Result<i32> {
    let dir = build(root)?;
    let (Some(table), Some(arena), Some(out)) = (table, arena, out) else {
        println!("{}", dir.display());
        return Ok(0);
    };
    let mut options = options.to_vec();
    if let Some(block) = launch {
        let file = dir.join("launch.bin");
        std::fs::write(&file, block).with_context(|| format!("writing {}", file.display()))?;
        options.extend(["--launch".to_string(), file.display().to_string()]);
    }
    let mut cmd = command(&dir, &dir.join(SO), table, arena, out, &options);
    eprintln!("$ {}", crate::command_line(&cmd));
    let status = cmd.status().with_context(|| {
        format!("starting {QEMU_USER}; `cargo xtask setup` installs qemu-user-static")
    })?;
    Ok(status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use device_runtime::abi::{TableHeader, ABI_VERSION, HEADER_SIZE, MAGIC};

    /// The value of `#define NAME VALUE` in `source`.
    fn define<'a>(source: &'a str, name: &str) -> &'a str {
        let prefix = format!("#define {name} ");
        source
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("launcher.c defines no {name}"))
            .trim()
    }

    /// The launcher reads a table file's header by hand to refuse bytes
    /// after the table: its constants must be the ABI's.
    #[test]
    fn the_launchers_table_header_fields_are_the_abis() {
        let path = crate::workspace_root().join("launcher/launcher.c");
        let c = std::fs::read_to_string(&path).unwrap();
        let magic: String = MAGIC.escape_ascii().to_string();
        assert_eq!(define(&c, "TABLE_MAGIC"), format!("\"{magic}\""));
        assert_eq!(define(&c, "TABLE_ABI_VERSION"), format!("{ABI_VERSION}u"));
        assert_eq!(define(&c, "TABLE_HEADER_SIZE"), format!("{HEADER_SIZE}u"));
        for (name, at) in [
            (
                "TABLE_VERSION_AT",
                std::mem::offset_of!(TableHeader, abi_version),
            ),
            (
                "TABLE_HEADER_SIZE_AT",
                std::mem::offset_of!(TableHeader, header_size),
            ),
            (
                "TABLE_TOTAL_LEN_AT",
                std::mem::offset_of!(TableHeader, total_len),
            ),
        ] {
            assert_eq!(define(&c, name), format!("{at}u"), "{name}");
        }
    }
}
