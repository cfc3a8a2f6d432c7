//! `cargo xtask <command>`: the project's build, run and CI tasks.
//!
//! - `setup`: installs what the build needs (apt packages, cargo-binutils,
//!   the rustup target and components).
//! - `bindgen [--check]`: regenerates (or checks) the kernel bindings.
//! - `header [--check]`: regenerates (or checks) the AICPU program's C
//!   header, `aicpu/include/wsp_aicpu.h`.
//! - `dist [--out DIR]`: the device artifacts (firmware, libwsp_aicpu.so,
//!   its header, a manifest) in one folder, the shared object checked.
//! - `fw`: builds the QEMU firmware and reports its size.
//! - `qemu <table.bin>`: runs a descriptor table on the firmware under QEMU,
//!   prints its decoded `defmt` log and, with `--trace FILE`, writes the
//!   run's Chrome trace-event file.
//! - `qemu-bench`: the firmware's overhead per task in QEMU, against a baseline.
//! - `launcher <table.bin>`: runs a descriptor table through the AICPU
//!   shared object under qemu-user, CANN's launch flow stood in for by the
//!   C launcher in `launcher/` (see [`launcher`]).
//! - `ci`: every check, in the order CI runs them.

#![deny(clippy::undocumented_unsafe_blocks)]

mod bindgen;
mod ci;
mod dist;
#[cfg(test)]
mod docs_check;
mod fw;
mod header;
mod launcher;
mod qemu;
mod qemu_bench;
#[cfg(test)]
mod qemu_tests;
mod qemu_trace;
mod setup;
mod target;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "pto-wsp build, run and CI tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: apt packages, cargo-binutils, the rustup target and components.
    Setup,
    /// Regenerate ffi/src/bindings.rs from the kernel ABI header.
    Bindgen {
        /// Only check that the checked-in bindings are up to date.
        #[arg(long)]
        check: bool,
    },
    /// Regenerate aicpu/include/wsp_aicpu.h (the AICPU program's C header) with cbindgen.
    Header {
        /// Only check that the checked-in header is up to date.
        #[arg(long)]
        check: bool,
    },
    /// Build the QEMU firmware (release) and print its path and size.
    Fw,
    /// Build the device artifacts into one folder: firmware.elf/.bin,
    /// libwsp_aicpu.so (checked), wsp_aicpu.h, manifest.json.
    Dist {
        /// The folder (default: target/dist).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run a descriptor table on the firmware under QEMU; exits with the firmware's status.
    Qemu {
        /// The descriptor table (loaded at the firmware's table address).
        table: PathBuf,
        /// The initial data arena (zeroes if absent).
        #[arg(long)]
        arena: Option<PathBuf>,
        /// Where to copy the arena the firmware writes back after a successful run.
        #[arg(long)]
        out: Option<PathBuf>,
        /// The program's symbols, bound at launch (e.g. `--symbols 3,7`),
        /// loaded as a launch block; none if absent.
        #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
        symbols: Option<Vec<i64>>,
        /// Scheduler threads, 1 to 4 (CPUs 0-3; CPUs 4-7 are the AICores).
        /// Default: the runtime's, as for `wsp run` (2).
        #[arg(long)]
        threads: Option<u32>,
        /// Dispatch policy: round-robin, affinity, hash, work-stealing,
        /// shared, adaptive. Default: the runtime's, as for `wsp run`
        /// (work-stealing).
        #[arg(long)]
        policy: Option<String>,
        /// Time limit for QEMU, in seconds.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
        timeout_secs: u64,
        /// The CPU model QEMU emulates (`-cpu`).
        #[arg(long, default_value = qemu::DEFAULT_CPU, value_parser = qemu::CPU_MODELS)]
        cpu: String,
        /// Record the run's events and write them here as a Chrome
        /// trace-event file (opens in Perfetto or chrome://tracing).
        #[arg(long)]
        trace: Option<PathBuf>,
    },
    /// Per-task overhead of the firmware in QEMU (empty kernels) on three
    /// graphs, as a ratio to a launch + poll loop in the same image.
    QemuBench {
        /// Independent tasks; the chain and the fan-out/fan-in rounds scale with it.
        #[arg(long, default_value_t = qemu_bench::TASKS)]
        tasks: u32,
        /// Small sizes (as CI's bench smoke step runs), instead of --tasks.
        #[arg(long, conflicts_with = "tasks")]
        smoke: bool,
        /// Scheduler threads, 1 to 4. With 1 the graphs use the CPUs the
        /// baseline uses (CPU 0 and the 4 AICores).
        #[arg(long, default_value_t = 1)]
        threads: u32,
        /// Runs of each graph and of its baseline; the least time counts.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        samples: u32,
        /// What the firmware's timer counts: emulated instructions
        /// (reproducible) or the host's clock (varies with the host's load).
        #[arg(long, value_enum, default_value_t = qemu_bench::Clock::Icount)]
        clock: qemu_bench::Clock,
    },
    /// Run a descriptor table through the AICPU shared object under
    /// qemu-user, with the C launcher standing in for CANN and the AICores;
    /// exits with the launcher's status.
    Launcher {
        /// The descriptor table (none with --build-only).
        #[arg(required_unless_present = "build_only")]
        table: Option<PathBuf>,
        /// The initial data arena.
        #[arg(long, required_unless_present = "build_only")]
        arena: Option<PathBuf>,
        /// Where to write the arena after a successful run.
        #[arg(long, required_unless_present = "build_only")]
        out: Option<PathBuf>,
        /// AICPU threads calling the server entry point.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
        threads: u32,
        /// Emulated cube cores (numbered first).
        #[arg(long, default_value_t = 2)]
        cube: u32,
        /// Emulated vector cores (numbered after the cube cores).
        #[arg(long, default_value_t = 2)]
        vector: u32,
        /// A fault to inject: never-ack=CORE, never-fin=CORE or
        /// error=KERNEL_ID:CODE (repeatable).
        #[arg(long)]
        fault: Vec<String>,
        /// A kernel id left out of the kernel address table (not built in; repeatable).
        #[arg(long)]
        omit_kernel: Vec<u32>,
        /// Symbols bound at launch (e.g. `--symbols 3,7`), in a launch block.
        #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
        symbols: Option<Vec<i64>>,
        /// Scheduler threads asked for in the launch block (at most --threads).
        #[arg(long)]
        sched_threads: Option<u32>,
        /// Dispatch policy, in the launch block (as `cargo xtask qemu --policy`).
        #[arg(long)]
        policy: Option<String>,
        /// Launches (Init, then the server entry) in one load of the `.so`,
        /// each on a fresh copy of the arena; all but the faulty ones must
        /// give equal arenas.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: Option<u32>,
        /// How many of the first launches carry the faults (default: all);
        /// each of them must fail, the last launch must not be one.
        #[arg(long, requires = "repeat")]
        faulty_launches: Option<u32>,
        /// Only build the launcher and the shared object; print their directory.
        #[arg(long)]
        build_only: bool,
    },
    /// Run every check CI runs: setup, fmt, clippy, bindgen, firmware, tests.
    Ci,
}

fn main() -> Result<()> {
    let root = workspace_root();
    match Cli::parse().command {
        Task::Setup => setup::setup(),
        Task::Bindgen { check } => bindgen::bindgen(&root, check),
        Task::Header { check } => header::header(&root, check),
        Task::Fw => fw::fw(&root).map(drop),
        Task::Dist { out } => dist::dist(&root, &out.unwrap_or_else(|| dist::default_out(&root))),
        Task::Qemu {
            table,
            arena,
            out,
            symbols,
            threads,
            policy,
            timeout_secs,
            cpu,
            trace,
        } => {
            // A launch block only when something is bound or chosen.
            let launch = (symbols.is_some() || threads.is_some() || policy.is_some())
                .then(|| {
                    let symbols = symbols.unwrap_or_default();
                    qemu::launch_block(
                        &symbols,
                        threads.unwrap_or(0),
                        policy.as_deref().unwrap_or(""),
                    )
                })
                .transpose()
                .map_err(|e| anyhow::anyhow!("--symbols/--threads/--policy: {e}"))?;
            let files = Files {
                out: out.as_deref(),
                trace: trace.as_deref(),
            };
            let status = run_qemu(&root, table, arena, launch, files, timeout_secs, cpu)?;
            std::process::exit(status)
        }
        Task::QemuBench {
            tasks,
            smoke,
            threads,
            samples,
            clock,
        } => {
            let (tasks, samples) = if smoke {
                (qemu_bench::SMOKE_TASKS, 1)
            } else {
                (tasks, samples)
            };
            qemu_bench::qemu_bench(&root, tasks, threads, samples, clock)
        }
        Task::Launcher {
            table,
            arena,
            out,
            threads,
            cube,
            vector,
            fault,
            omit_kernel,
            symbols,
            sched_threads,
            policy,
            repeat,
            faulty_launches,
            build_only,
        } => {
            let mut options = vec![
                "--threads".to_string(),
                threads.to_string(),
                "--cube".to_string(),
                cube.to_string(),
                "--vector".to_string(),
                vector.to_string(),
            ];
            for f in fault {
                options.extend(["--fault".to_string(), f]);
            }
            for k in omit_kernel {
                options.extend(["--omit-kernel".to_string(), k.to_string()]);
            }
            if let Some(n) = repeat {
                options.extend(["--repeat".to_string(), n.to_string()]);
            }
            if let Some(k) = faulty_launches {
                options.extend(["--faulty-launches".to_string(), k.to_string()]);
            }
            // A launch block only when something is bound or chosen.
            let launch = (symbols.is_some() || sched_threads.is_some() || policy.is_some())
                .then(|| {
                    qemu::launch_block(
                        &symbols.unwrap_or_default(),
                        sched_threads.unwrap_or(0),
                        policy.as_deref().unwrap_or(""),
                    )
                })
                .transpose()
                .map_err(|e| anyhow::anyhow!("--symbols/--sched-threads/--policy: {e}"))?;
            let run = (!build_only).then_some(());
            let status = launcher::launcher(
                &root,
                run.and(table.as_deref()),
                run.and(arena.as_deref()),
                run.and(out.as_deref()),
                launch.as_deref(),
                &options,
            )?;
            std::process::exit(status)
        }
        Task::Ci => ci::ci(&root),
    }
}

/// Where `cargo xtask qemu` writes what the run produced.
struct Files<'a> {
    /// The arena the firmware wrote back.
    out: Option<&'a Path>,
    /// The run's Chrome trace-event file.
    trace: Option<&'a Path>,
}

/// Builds the firmware, runs it on `table` with QEMU's own output passed
/// through, prints the firmware's decoded log, copies `arena.out` and
/// writes the trace to `files`, and returns the firmware's exit status.
fn run_qemu(
    root: &Path,
    table: PathBuf,
    arena: Option<PathBuf>,
    launch: Option<Vec<u8>>,
    files: Files<'_>,
    secs: u64,
    cpu: String,
) -> Result<i32> {
    let firmware = fw::build(root)?;
    let run = qemu::QemuRun {
        table: Some(table),
        arena,
        launch,
        timeout_secs: secs,
        cpu,
        trace: files.trace.is_some(),
        ..qemu::QemuRun::new(firmware)
    };
    let outcome = run.run()?;
    for line in &outcome.log {
        println!("{line}");
    }
    if let Some(path) = files.trace {
        match &outcome.trace {
            Some(trace) => {
                let doc = qemu_trace::chrome_trace(trace, |k| {
                    wsp_ffi::lookup(k).map_or_else(|| format!("kernel {k}"), |i| i.name.to_string())
                });
                let text = serde_json::to_string(&doc)?;
                std::fs::write(path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                let dropped: u64 = trace.dropped.iter().map(|&d| u64::from(d)).sum();
                eprintln!(
                    "xtask: {} trace events ({dropped} dropped: the queues were full) in {}",
                    trace.events.len(),
                    path.display()
                );
            }
            None => eprintln!(
                "xtask: the firmware wrote no trace (it failed before the end); {} not written",
                path.display()
            ),
        }
    }
    if let Some(out) = files.out {
        match &outcome.arena_out {
            Some(bytes) => {
                std::fs::write(out, bytes).with_context(|| format!("writing {}", out.display()))?
            }
            None => eprintln!(
                "xtask: the firmware wrote no arena.out; {} not written",
                out.display()
            ),
        }
    }
    Ok(outcome.status)
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

/// `cargo` (the one running this xtask, when there is one) in `root`.
fn cargo(root: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root);
    cmd
}

/// Prints `cmd`, runs it with inherited stdio and fails unless it succeeds.
fn run(cmd: &mut Command) -> Result<()> {
    let line = command_line(cmd);
    eprintln!("$ {line}");
    let status = cmd.status().with_context(|| format!("starting {line}"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// `cmd`'s program and arguments, space-separated.
fn command_line(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program());
    std::iter::once(program)
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
