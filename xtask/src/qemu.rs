//! Runs the pto-wsp firmware under QEMU `virt` with a descriptor table, a
//! data arena and a launch block loaded where its memory map expects them (see
//! `device_runtime::abi::memory_map`), and collects the exit status, the output and the
//! arena the firmware writes back (`arena.out`, a semihosting file created
//! in QEMU's working directory, which is a fresh temporary directory).
//!
//! Self-contained (std and `device-runtime` only, no other module of its
//! crate), so that other crates, e.g. integration tests, can include it with
//! `#[path = "<root>/xtask/src/qemu.rs"] mod qemu;`.
#![allow(dead_code)] // Each includer uses a different part of it.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use device_runtime::abi::launch::{encode_block, LaunchError, LAUNCH_MAX};
use device_runtime::abi::memory_map::{ARENA_ADDR, CPUS, LAUNCH_ADDR, RAM_MIB, TABLE_ADDR};

/// The QEMU binary (Debian package `qemu-system-arm`).
pub const QEMU: &str = "qemu-system-aarch64";
/// The launch block's file in QEMU's working directory.
const LAUNCH_FILE: &str = "launch.bin";
/// The file the firmware writes the arena to after a successful run.
pub const ARENA_OUT: &str = "arena.out";
/// Exit statuses of `timeout` when it stopped QEMU (SIGTERM, then SIGKILL).
const TIMED_OUT: [i32; 2] = [124, 137];

/// One run of the firmware.
#[derive(Clone, Debug)]
pub struct QemuRun {
    /// The firmware ELF.
    pub firmware: PathBuf,
    /// The descriptor table; without one the table window reads as zeroes.
    pub table: Option<PathBuf>,
    /// The initial arena; without one the arena reads as zeroes.
    pub arena: Option<PathBuf>,
    /// The launch block's bytes (see [`launch_block`]); without one the
    /// firmware binds no symbols.
    pub launch: Option<Vec<u8>>,
    /// Time limit, in whole seconds (at least 1: `timeout` reads 0 as none).
    pub timeout_secs: u64,
    /// CPUs QEMU starts (`-smp`); the firmware needs [`CPUS`].
    pub smp: usize,
    /// Capture QEMU's stdout and stderr into the outcome instead of passing
    /// them through to this process's.
    pub capture: bool,
    /// Words on the semihosting command line after the image's name: the
    /// firmware's measuring modes (`empty-kernels`, `baseline=N`); none for
    /// a normal run.
    pub args: Vec<String>,
    /// Run the CPUs one at a time (single-threaded TCG, switching at the
    /// firmware's `yield` spin hints) with the virtual clock counting
    /// instructions (`-icount shift=0`: 1 ns each), so that the timer
    /// measures emulated work whatever the host's load; otherwise each CPU
    /// has a host thread and the timer follows the host's clock.
    pub icount: bool,
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct QemuOutcome {
    /// The firmware's exit status (semihosting exit code).
    pub status: i32,
    /// What the firmware printed; empty unless captured.
    pub stdout: String,
    pub stderr: String,
    /// The arena the firmware wrote back, if it wrote one.
    pub arena_out: Option<Vec<u8>>,
}

impl QemuOutcome {
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// Why a run did not produce an outcome.
#[derive(Debug)]
pub enum QemuError {
    /// A file, the temporary directory or QEMU itself could not be used.
    Io { what: String, error: io::Error },
    /// QEMU was still running after the time limit.
    TimedOut { secs: u64 },
    /// QEMU ended through a signal.
    Signaled,
}

impl fmt::Display for QemuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QemuError::Io { what, error } => write!(f, "{what}: {error}"),
            QemuError::TimedOut { secs } => write!(f, "QEMU did not finish within {secs} s"),
            QemuError::Signaled => write!(f, "QEMU was killed by a signal"),
        }
    }
}

// `Display` already includes an I/O error's message, so there is no `source`.
impl std::error::Error for QemuError {}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> QemuError {
    let what = what.into();
    move |error| QemuError::Io { what, error }
}

impl QemuRun {
    /// A run of `firmware` with no table or arena, a 60 s limit, output passed through.
    pub fn new(firmware: impl Into<PathBuf>) -> Self {
        QemuRun {
            firmware: firmware.into(),
            table: None,
            arena: None,
            launch: None,
            timeout_secs: 60,
            smp: CPUS,
            capture: false,
            args: Vec::new(),
            icount: false,
        }
    }

    /// The command line, with relative paths made absolute; it must run in
    /// `dir`, where `arena.out` is to appear (and the launch block is written).
    pub fn command(&self, dir: &Path) -> Result<Command, QemuError> {
        let mut cmd = Command::new("timeout");
        cmd.args([
            "--foreground",
            "--kill-after=5",
            &self.limit_secs().to_string(),
            QEMU,
        ]);
        cmd.args(["-M", "virt", "-cpu", "cortex-a57"]);
        cmd.arg("-smp").arg(self.smp.to_string());
        cmd.arg("-m").arg(format!("{RAM_MIB}M"));
        // `-nic none`: without it QEMU looks for a NIC ROM that a minimal install lacks.
        cmd.args(["-nographic", "-nic", "none"]);
        if self.icount {
            cmd.args([
                "-accel",
                "tcg,thread=single",
                "-icount",
                "shift=0,sleep=off",
            ]);
        }
        if self.args.is_empty() {
            cmd.arg("-semihosting");
        } else {
            // The first word is the image's name, as in QEMU's default
            // command line; a comma in a value is doubled.
            let mut config = String::from("enable=on,target=native,arg=firmware");
            for arg in &self.args {
                config.push_str(",arg=");
                config.push_str(&arg.replace(',', ",,"));
            }
            cmd.arg("-semihosting-config").arg(config);
        }
        cmd.arg("-kernel");
        cmd.arg(existing(&self.firmware, "firmware")?);
        for (file, addr, what) in [
            (&self.table, TABLE_ADDR, "table"),
            (&self.arena, ARENA_ADDR, "arena"),
        ] {
            if let Some(file) = file {
                cmd.arg("-device").arg(loader(&existing(file, what)?, addr));
            }
        }
        if let Some(block) = &self.launch {
            let path = dir.join(LAUNCH_FILE);
            std::fs::write(&path, block).map_err(io_err(format!("writing {}", path.display())))?;
            cmd.arg("-device").arg(loader(&path, LAUNCH_ADDR));
        }
        Ok(cmd)
    }

    /// The time limit `timeout` gets.
    fn limit_secs(&self) -> u64 {
        self.timeout_secs.max(1)
    }

    /// Runs QEMU to the end (or the time limit) in a temporary directory.
    pub fn run(&self) -> Result<QemuOutcome, QemuError> {
        let dir = TempDir::new()?;
        let mut cmd = self.command(&dir.0)?;
        cmd.current_dir(&dir.0).stdin(Stdio::null());
        let (status, stdout, stderr) = if self.capture {
            let out = cmd.output().map_err(io_err(format!("running {QEMU}")))?;
            let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
            (out.status, text(out.stdout), text(out.stderr))
        } else {
            let status = cmd.status().map_err(io_err(format!("running {QEMU}")))?;
            (status, String::new(), String::new())
        };
        let status = status.code().ok_or(QemuError::Signaled)?;
        if TIMED_OUT.contains(&status) {
            return Err(QemuError::TimedOut {
                secs: self.limit_secs(),
            });
        }
        let out_path = dir.0.join(ARENA_OUT);
        let arena_out = match std::fs::read(&out_path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(format!("reading {}", out_path.display()))(e)),
        };
        Ok(QemuOutcome {
            status,
            stdout,
            stderr,
            arena_out,
        })
    }
}

/// A launch block binding `symbols`, with `threads` scheduler threads (0:
/// the firmware's default) and the dispatch policy called `policy` (empty:
/// the default), encoded by the runtime's own
/// [`encode_block`]. The policy
/// name is not looked up (the firmware reports an unknown one).
pub fn launch_block(symbols: &[i64], threads: u32, policy: &str) -> Result<Vec<u8>, LaunchError> {
    let mut block = [0u8; LAUNCH_MAX];
    let len = encode_block(symbols, threads, policy, &mut block)?;
    Ok(block[..len].to_vec())
}

/// `path` made absolute, or an error naming `what` if there is no such file.
fn existing(path: &Path, what: &str) -> Result<PathBuf, QemuError> {
    let abs = std::path::absolute(path).map_err(io_err(format!("{what} {}", path.display())))?;
    std::fs::metadata(&abs).map_err(io_err(format!("{what} {}", abs.display())))?;
    Ok(abs)
}

/// A generic-loader device putting `file`'s raw bytes at `addr`.
fn loader(file: &Path, addr: usize) -> OsString {
    // QEMU's option syntax escapes a comma in a value by doubling it.
    let file = file.to_string_lossy().replace(',', ",,");
    OsString::from(format!("loader,file={file},addr={addr:#x},force-raw=on"))
}

/// A fresh directory, removed with its contents when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, QemuError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!("wsp-qemu-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                // Left behind by an earlier process with the same id.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(format!("creating {}", path.display()))(e)),
            }
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Best effort: a leftover directory in the temp dir is harmless.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
