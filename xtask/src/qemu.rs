//! Runs the pto-wsp firmware under QEMU `virt` with a descriptor table, a
//! data arena and a launch block loaded where its memory map expects them (see
//! `device_runtime::abi::memory_map`), and collects the exit status, the
//! firmware's log, the arena it writes back (`arena.out`, a semihosting file
//! created in QEMU's working directory, which is a fresh temporary
//! directory) and, if asked for, its trace (`trace.out`).
//!
//! The firmware logs through `defmt`: its frames arrive in the semihosting
//! file `defmt.out` and are decoded here ([`decode_log`]) with
//! `defmt-decoder` and the table of strings in the firmware's ELF.
//!
//! Self-contained (std, `device-runtime` and `defmt-decoder` only, no other
//! module of its crate), so that other crates, e.g. integration tests, can
//! include it with `#[path = "<root>/xtask/src/qemu.rs"] mod qemu;`.
#![allow(dead_code)] // Each includer uses a different part of it.

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use device_runtime::abi::launch::{encode_block, LaunchError, LAUNCH_MAX};
use device_runtime::abi::memory_map::{ARENA_ADDR, CPUS, LAUNCH_ADDR, RAM_MIB, TABLE_ADDR};
use device_runtime::sched::RunOptions;

/// The QEMU binary (Debian package `qemu-system-arm`).
pub const QEMU: &str = "qemu-system-aarch64";
/// The CPU models (QEMU `-cpu`) the firmware is tested on: the Cortex-A57
/// (ARMv8.0-A: exclusives, no LSE atomics) and QEMU's `max` (every feature
/// QEMU emulates, LSE atomics among them).
pub const CPU_MODELS: [&str; 2] = ["cortex-a57", "max"];
/// The CPU model of a run unless it says otherwise.
pub const DEFAULT_CPU: &str = CPU_MODELS[0];
/// The launch block's file in QEMU's working directory.
const LAUNCH_FILE: &str = "launch.bin";
/// The file the firmware writes the arena to after a successful run.
pub const ARENA_OUT: &str = "arena.out";
/// The file the firmware writes its `defmt` log frames to.
pub const LOG_FILE: &str = "defmt.out";
/// The file the firmware writes its trace to (with the word `trace`).
pub const TRACE_FILE: &str = "trace.out";
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
    /// The CPU model (`-cpu`), one of [`CPU_MODELS`].
    pub cpu: String,
    /// Capture QEMU's stdout and stderr into the outcome instead of passing
    /// them through to this process's.
    pub capture: bool,
    /// Words on the semihosting command line after the image's name: the
    /// firmware's measuring modes (`empty-kernels`, `baseline=N`), a fault
    /// and its timeouts (`fault=F`, `kernel-timeout-ms=N`,
    /// `ack-timeout-ms=N`: 0 ms is refused before QEMU starts); none for a
    /// normal run.
    pub args: Vec<String>,
    /// Run the CPUs one at a time (single-threaded TCG, switching at the
    /// firmware's `yield` spin hints) with the virtual clock counting
    /// instructions (`-icount shift=0`: 1 ns each), so that the timer
    /// measures emulated work whatever the host's load; otherwise each CPU
    /// has a host thread and the timer follows the host's clock.
    pub icount: bool,
    /// Record a trace of the run (the firmware's word `trace`), returned
    /// in [`QemuOutcome::trace`].
    pub trace: bool,
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct QemuOutcome {
    /// The firmware's exit status (semihosting exit code).
    pub status: i32,
    /// The firmware's log messages, one a line (whatever the capture),
    /// then anything QEMU itself printed if captured.
    pub stdout: String,
    /// What QEMU printed to stderr, if captured.
    pub stderr: String,
    /// The firmware's log, decoded, with levels.
    pub log: Vec<LogLine>,
    /// The arena the firmware wrote back, if it wrote one.
    pub arena_out: Option<Vec<u8>>,
    /// The run's trace, if one was asked for and the firmware wrote it.
    pub trace: Option<Trace>,
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
    /// The firmware's log or trace could not be read.
    Output { what: String, reason: String },
    /// A file or word the run was given is refused before QEMU starts:
    /// `what` names it, `reason` says why.
    Input { what: String, reason: String },
}

impl fmt::Display for QemuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QemuError::Io { what, error } => write!(f, "{what}: {error}"),
            QemuError::TimedOut { secs } => write!(f, "QEMU did not finish within {secs} s"),
            QemuError::Signaled => write!(f, "QEMU was killed by a signal"),
            QemuError::Output { what, reason } | QemuError::Input { what, reason } => {
                write!(f, "{what}: {reason}")
            }
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
            cpu: DEFAULT_CPU.into(),
            capture: false,
            args: Vec::new(),
            icount: false,
            trace: false,
        }
    }

    /// The words on the semihosting command line after the image's name.
    fn words(&self) -> Vec<String> {
        let mut words = self.args.clone();
        if self.trace {
            words.push("trace".into());
        }
        words
    }

    /// The command line, with relative paths made absolute; it must run in
    /// `dir`, where `arena.out` is to appear (and the launch block is written).
    /// A table file with bytes after its table (`check_table_file`) and a
    /// timeout word the run would refuse (`check_timeout_word`) are
    /// refused here, before QEMU boots.
    pub fn command(&self, dir: &Path) -> Result<Command, QemuError> {
        for word in &self.args {
            check_timeout_word(word)?;
        }
        let mut cmd = Command::new("timeout");
        cmd.args([
            "--foreground",
            "--kill-after=5",
            &self.limit_secs().to_string(),
            QEMU,
        ]);
        cmd.args(["-M", "virt", "-cpu", &self.cpu]);
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
        let words = self.words();
        if words.is_empty() {
            cmd.arg("-semihosting");
        } else {
            // The first word is the image's name, as in QEMU's default
            // command line; a comma in a value is doubled.
            let mut config = String::from("enable=on,target=native,arg=firmware");
            for arg in &words {
                config.push_str(",arg=");
                config.push_str(&arg.replace(',', ",,"));
            }
            cmd.arg("-semihosting-config").arg(config);
        }
        cmd.arg("-kernel");
        cmd.arg(existing(&self.firmware, "firmware")?);
        if let Some(table) = &self.table {
            let table = existing(table, "table")?;
            check_table_file(&table)?;
            cmd.arg("-device").arg(loader(&table, TABLE_ADDR));
        }
        if let Some(arena) = &self.arena {
            cmd.arg("-device")
                .arg(loader(&existing(arena, "arena")?, ARENA_ADDR));
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
        let arena_out = read_if_written(&dir.0.join(ARENA_OUT))?;
        let log = match read_if_written(&dir.0.join(LOG_FILE))? {
            Some(frames) => {
                let elf = std::fs::read(&self.firmware)
                    .map_err(io_err(format!("reading {}", self.firmware.display())))?;
                decode_log(&elf, &frames).map_err(|reason| QemuError::Output {
                    what: format!("the firmware's log ({LOG_FILE})"),
                    reason,
                })?
            }
            None => Vec::new(),
        };
        let trace = match read_if_written(&dir.0.join(TRACE_FILE))? {
            Some(bytes) if self.trace => {
                Some(Trace::parse(&bytes).map_err(|reason| QemuError::Output {
                    what: format!("the firmware's trace ({TRACE_FILE})"),
                    reason,
                })?)
            }
            _ => None,
        };
        let mut text = String::new();
        for line in &log {
            text.push_str(&line.message);
            text.push('\n');
        }
        text.push_str(&stdout);
        Ok(QemuOutcome {
            status,
            stdout: text,
            stderr,
            log,
            arena_out,
            trace,
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

/// The bytes of the file at `path`, or `None` if the firmware wrote none.
fn read_if_written(path: &Path) -> Result<Option<Vec<u8>>, QemuError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(format!("reading {}", path.display()))(e)),
    }
}

/// One line of the firmware's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// Its level (`info`, `error`, ..); none for `defmt::println`.
    pub level: Option<&'static str>,
    /// When it was logged, as the firmware's timestamp says (microseconds).
    pub timestamp: Option<String>,
    pub message: String,
}

impl fmt::Display for LogLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(ts) = &self.timestamp {
            write!(f, "{ts} ")?;
        }
        let level = self.level.unwrap_or("").to_uppercase();
        write!(f, "{level:<5} {}", self.message)
    }
}

/// Decodes the `defmt` log `frames` of the firmware `elf` (its `.defmt`
/// table gives the strings). A frame cut short at the end (QEMU stopped
/// mid-write) ends the log; a malformed frame is an error.
pub fn decode_log(elf: &[u8], frames: &[u8]) -> Result<Vec<LogLine>, String> {
    let table = defmt_decoder::Table::parse(elf)
        .map_err(|e| format!("reading the firmware's defmt table: {e}"))?
        .ok_or("the firmware has no defmt table (.defmt section)")?;
    let mut decoder = table.new_stream_decoder();
    decoder.received(frames);
    let mut lines = Vec::new();
    loop {
        match decoder.decode() {
            Ok(frame) => lines.push(LogLine {
                level: frame.level().map(|l| l.as_str()),
                timestamp: frame.display_timestamp().map(|t| t.to_string()),
                message: frame.display_message().to_string(),
            }),
            Err(defmt_decoder::DecodeError::UnexpectedEof) => return Ok(lines),
            Err(defmt_decoder::DecodeError::Malformed) => {
                return Err(format!(
                    "frame {} is malformed (is the ELF the one that ran?)",
                    lines.len() + 1
                ))
            }
        }
    }
}

/// What an event of a [`Trace`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A task on an AICore, from when it could start to when its scheduler
    /// thread saw it finish.
    Task,
    /// A scheduler thread handing a task to a core.
    Issue,
    /// A scheduler thread's whole run.
    Thread,
    /// A scheduler thread waiting, from when its rounds found nothing to
    /// do to its next launch or completion.
    Idle,
}

/// One event of a [`Trace`] (times in ticks of the firmware's timer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    pub kind: EventKind,
    /// The scheduler thread that recorded it.
    pub thread: u16,
    /// The run core (tasks and issues).
    pub core: u16,
    /// Which task it is (tasks and issues): FNV-1a over the kernel id and
    /// the arguments, tensor addresses as arena offsets (the firmware's
    /// `trace::task_key` says how), the same for the same task in any runner.
    pub key: u32,
    /// The kernel id (tasks and issues).
    pub kernel: u32,
    /// The cycles the kernel reported (tasks).
    pub cycles: u32,
    pub start: u64,
    pub end: u64,
}

/// Bytes of one record of a trace (version 2).
const RECORD_BYTES: usize = 24;

/// A run's trace as the firmware writes it (`trace.out`; its layout is
/// documented in the firmware's `trace` module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// The timer's frequency (ticks per second).
    pub ticks_per_second: u64,
    /// Events each scheduler thread dropped because its queue was full.
    pub dropped: Vec<u32>,
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// Parses a `trace.out`; the error names what is wrong with it.
    pub fn parse(bytes: &[u8]) -> Result<Trace, String> {
        let mut at = 0usize;
        let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
            let piece = bytes
                .get(at..at + n)
                .ok_or_else(|| format!("cut short in its {what} (at byte {at})"))?;
            at += n;
            Ok(piece)
        };
        let u32_of = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        if take(4, "magic")? != b"WSPT" {
            return Err("not a trace (its magic is not WSPT)".into());
        }
        let version = u32_of(take(4, "version")?);
        if version != 2 {
            return Err(format!("version {version}; this reader knows 2"));
        }
        let ticks_per_second = u64_of(take(8, "header")?);
        if ticks_per_second == 0 {
            return Err("its timer frequency is 0".into());
        }
        let base = u64_of(take(8, "header")?);
        let threads = u32_of(take(4, "header")?) as usize;
        let record = u32_of(take(4, "header")?) as usize;
        if record != RECORD_BYTES {
            return Err(format!(
                "records of {record} bytes; this reader knows {RECORD_BYTES}"
            ));
        }
        if threads > 64 {
            return Err(format!("{threads} threads"));
        }
        let mut dropped = Vec::with_capacity(threads);
        for _ in 0..threads {
            dropped.push(u32_of(take(4, "dropped counts")?));
        }
        let rest = &bytes[at..];
        if !rest.len().is_multiple_of(record) {
            return Err(format!(
                "{} bytes of records, not a whole number of {record}-byte records",
                rest.len()
            ));
        }
        let mut events = Vec::with_capacity(rest.len() / record);
        for r in rest.chunks_exact(record) {
            let kind = match r[0] & 0x0f {
                0 => EventKind::Task,
                1 => EventKind::Issue,
                2 => EventKind::Thread,
                3 => EventKind::Idle,
                k => return Err(format!("an event of unknown kind {k}")),
            };
            // Ticks after the base, in 48 bits.
            let at = |i: usize| {
                let mut bytes = [0u8; 8];
                bytes[..6].copy_from_slice(&r[i..i + 6]);
                base.checked_add(u64::from_le_bytes(bytes))
                    .ok_or_else(|| format!("an event's time passes 2^64 ticks (base {base})"))
            };
            let (start, end) = (at(12)?, at(18)?);
            if end < start {
                return Err(format!("an event ends ({end}) before it starts ({start})"));
            }
            events.push(TraceEvent {
                kind,
                thread: u16::from(r[0] >> 4),
                core: u16::from(r[1]),
                kernel: u32::from(u16::from_le_bytes([r[2], r[3]])),
                key: u32_of(&r[4..8]),
                cycles: u32_of(&r[8..12]),
                start,
                end,
            });
        }
        Ok(Trace {
            ticks_per_second,
            dropped,
            events,
        })
    }

    /// Ticks as whole nanoseconds, to the nearest, in integer arithmetic:
    /// exact, and a later tick never comes out earlier (a timer of 0 ticks
    /// a second, which [`Trace::parse`] refuses, counts as 1).
    pub fn nanos(&self, ticks: u64) -> u128 {
        let tps = u128::from(self.ticks_per_second.max(1));
        (u128::from(ticks) * 1_000_000_000 + tps / 2) / tps
    }
}

/// Refuses a table file with bytes after its header's `total_len`, as `wsp
/// run` and `wsp inspect` do: a file is one table, and the firmware reads
/// `total_len` bytes of its table window, so whatever follows them (`cat
/// table.bin x > t.bin`) would be silently ignored. Every other fault, a
/// file cut short included, is left to the firmware, which names it
/// (`RESULT ERROR invalid descriptor table: ..`, exit status 2).
fn check_table_file(path: &Path) -> Result<(), QemuError> {
    use device_runtime::abi::{exact_table_len, Problem};
    let bytes = std::fs::read(path).map_err(io_err(format!("reading {}", path.display())))?;
    match exact_table_len(&bytes) {
        Err(e) if matches!(e.problem, Problem::TrailingBytes { .. }) => Err(QemuError::Input {
            what: path.display().to_string(),
            reason: e.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Refuses the firmware word `kernel-timeout-ms=N` or `ack-timeout-ms=N`
/// with a value the runtime refuses ([`RunOptions::check`]: 0 ms), which
/// the firmware would only report once its CPUs are up and the table is
/// loaded. Other words, and a value that is no number (the firmware names
/// it as it reads its command line), pass.
fn check_timeout_word(word: &str) -> Result<(), QemuError> {
    let mut options = RunOptions::default();
    if let Some(ms) = word.strip_prefix("kernel-timeout-ms=") {
        let Ok(ms) = ms.parse() else { return Ok(()) };
        options.kernel_timeout_ms = ms;
    } else if let Some(ms) = word.strip_prefix("ack-timeout-ms=") {
        let Ok(ms) = ms.parse() else { return Ok(()) };
        options.ack_timeout_ms = ms;
    } else {
        return Ok(());
    }
    options.check().map_err(|e| QemuError::Input {
        what: word.to_string(),
        reason: e.to_string(),
    })
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
