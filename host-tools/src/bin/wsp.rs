//! `wsp`: build, run, verify and inspect pto-wsp workloads.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use device_runtime::abi::launch::Symbols;
use device_runtime::sched::RunOptions;
use device_runtime::sched::{DispatchKey, PolicyKind, SchedConfig};
use host_tools::inspect::inspect;
use host_tools::semantic::run_semantic_with;
use host_tools::shim::Shim;
use host_tools::table::Arena;
use host_tools::workload_file::{FileWorkload, WorkloadFile};
use host_tools::workloads::{Params, Verification, Workload, NAMES};

#[derive(Parser)]
#[command(name = "wsp", about = "Build, run and inspect pto-wsp workloads")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a workload, run it on the host shim and check it against the f64 reference.
    Run {
        #[command(flatten)]
        workload: WorkloadArgs,
        /// Emulated cube cores (matrix kernels).
        #[arg(long, default_value_t = 2)]
        cube: usize,
        /// Emulated vector cores (the other kernels).
        #[arg(long, default_value_t = 2)]
        vector: usize,
        /// Run in deterministic semantic time on one thread: kernels' cycle
        /// counts drive a virtual clock, and the run reports its makespan.
        #[arg(long)]
        semantic: bool,
        /// Scheduler threads (1 to 4); core c belongs to thread c % threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Dispatch policy: round-robin, affinity, hash, work-stealing, shared, adaptive.
        #[arg(long, default_value = "work-stealing")]
        policy: String,
        /// Dispatch key of the key-based policies: `task` (task index),
        /// `scalar:N` (scalar N), `tile:ARG:DIM` (tile index of argument
        /// ARG along dimension DIM, e.g. tile:2:0 = output row block of a
        /// GEMM), `stream` (the task's stream) or `loop:N` (the index of
        /// the program loop at nesting level N around the task, e.g. loop:0
        /// = the expert of `moe`).
        #[arg(long, default_value = "tile:2:0")]
        key: String,
        /// Tasks one dispatch queue may hold (1 to 256).
        #[arg(long, default_value_t = device_runtime::sched::DISPATCH_QUEUE)]
        queue_depth: usize,
        /// Tasks handed to one core at once: 1 (idle cores only) or 2 (also
        /// queue the next task behind a running one, as the device's double
        /// buffered handshake does). Default: 2.
        #[arg(long)]
        issue_depth: Option<usize>,
        /// Task window: at most this many tasks submitted and not retired
        /// (1 to 256). Default: the workload program's, else 256.
        #[arg(long)]
        window: Option<usize>,
    },
    /// Write a workload's table.bin and initial arena.bin (e.g. for `cargo xtask qemu`).
    Build {
        #[command(flatten)]
        workload: WorkloadArgs,
        #[arg(long)]
        out: PathBuf,
    },
    /// Check an arena produced by another runner (QEMU) against the reference.
    Verify {
        #[command(flatten)]
        workload: WorkloadArgs,
        #[arg(long)]
        arena: PathBuf,
    },
    /// Print a table (table.bin, or a workload file's) in readable form, with its validation result.
    Inspect {
        /// A table.bin, or a workload file (FILE.toml).
        table: PathBuf,
        /// Show every task, not only the first ones.
        #[arg(long)]
        all: bool,
        /// A workload file's symbol value, NAME=VALUE (repeatable).
        #[arg(long = "symbol", value_name = "NAME=VALUE")]
        symbols: Vec<String>,
    },
}

#[derive(Args)]
struct WorkloadArgs {
    /// A built-in workload (gemm, mlp, streams, moe, moe-var) or a workload
    /// file (a path ending in .toml, or to an existing file).
    workload: String,
    /// A workload file's symbol value, NAME=VALUE (repeatable); unset
    /// symbols take the file's defaults.
    #[arg(long = "symbol", value_name = "NAME=VALUE")]
    symbols: Vec<String>,
    #[arg(long)]
    m: Option<u32>,
    #[arg(long)]
    n: Option<u32>,
    #[arg(long)]
    k: Option<u32>,
    #[arg(long)]
    tile: Option<u32>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A built-in workload or a workload file's.
enum Loaded {
    Named(Workload),
    File(Box<FileWorkload>),
}

impl Loaded {
    fn name(&self) -> &str {
        match self {
            Loaded::Named(w) => w.name,
            Loaded::File(f) => &f.name,
        }
    }
    fn summary(&self) -> &str {
        match self {
            Loaded::Named(w) => &w.summary,
            Loaded::File(f) => &f.summary,
        }
    }
    fn table(&self) -> &[u8] {
        match self {
            Loaded::Named(w) => &w.table,
            Loaded::File(f) => &f.table,
        }
    }
    fn arena(&self) -> &Arena {
        match self {
            Loaded::Named(w) => &w.arena,
            Loaded::File(f) => &f.arena,
        }
    }
    fn tasks(&self) -> usize {
        match self {
            Loaded::Named(w) => w.tasks,
            Loaded::File(f) => f.tasks.len(),
        }
    }
    fn symbols(&self) -> &[i64] {
        match self {
            Loaded::Named(_) => &[],
            Loaded::File(f) => &f.symbols,
        }
    }
    /// `symbols  m = 4, ...` for a file with symbols.
    fn symbols_line(&self) -> Option<String> {
        match self {
            Loaded::File(f) if !f.symbols.is_empty() => Some(
                f.symbol_names
                    .iter()
                    .zip(&f.symbols)
                    .map(|(n, v)| format!("{n} = {v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            _ => None,
        }
    }
}

/// Whether `arg` names a workload file rather than a built-in workload.
fn is_file(arg: &str) -> bool {
    arg.ends_with(".toml") || (!NAMES.contains(&arg) && Path::new(arg).is_file())
}

/// `NAME=VALUE` arguments.
fn parse_symbols(args: &[String]) -> Result<Vec<(String, i64)>> {
    args.iter()
        .map(|a| {
            let (name, value) = a
                .split_once('=')
                .with_context(|| format!("--symbol {a}: expected NAME=VALUE"))?;
            let value = value
                .trim()
                .parse()
                .with_context(|| format!("--symbol {a}: {value} is not an integer"))?;
            Ok((name.trim().to_string(), value))
        })
        .collect()
}

fn load_file(path: &str, symbols: &[String]) -> Result<FileWorkload> {
    let symbols = parse_symbols(symbols)?;
    let file = WorkloadFile::load(Path::new(path)).map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
    file.build(&symbols)
        .map_err(|e| anyhow::anyhow!("{path}: {e}"))
}

impl WorkloadArgs {
    fn load(&self) -> Result<Loaded> {
        if !is_file(&self.workload) {
            if !self.symbols.is_empty() {
                bail!("--symbol applies to workload files, not to built-in workloads");
            }
            return Ok(Loaded::Named(self.build()?));
        }
        if self.m.or(self.n).or(self.k).or(self.tile).is_some() {
            bail!("--m, --n, --k and --tile apply to built-in workloads; a workload file gives its own sizes");
        }
        Ok(Loaded::File(Box::new(load_file(
            &self.workload,
            &self.symbols,
        )?)))
    }

    fn build(&self) -> Result<Workload> {
        let d = Params::default();
        let p = Params {
            m: self.m.unwrap_or(d.m),
            n: self.n.unwrap_or(d.n),
            k: self.k.unwrap_or(d.k),
            tile: self.tile.unwrap_or(d.tile),
            seed: self.seed,
        };
        // The mlp workload picks its own small sizes unless any is given.
        let p = if self.m.or(self.n).or(self.k).or(self.tile).is_none() {
            Params {
                seed: self.seed,
                ..d
            }
        } else {
            p
        };
        Workload::build(&self.workload, p)
            .with_context(|| format!("building workload (known: {})", NAMES.join(", ")))
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `task`, `scalar:N`, `tile:ARG:DIM`, `stream` or `loop:N`.
fn parse_key(text: &str) -> Result<DispatchKey> {
    text.parse()
        .map_err(|e| anyhow::anyhow!("--key {text}: {e}"))
}

fn run(cli: Cli) -> Result<bool> {
    match cli.command {
        Command::Run {
            workload,
            cube,
            vector,
            semantic,
            threads,
            policy,
            key,
            queue_depth,
            issue_depth,
            window,
        } => {
            let policy = PolicyKind::parse(&policy)
                .map_err(|e| anyhow::anyhow!("--policy {policy}: {e}"))?;
            let sched = SchedConfig {
                threads,
                policy,
                key: parse_key(&key)?,
                queue_depth,
            };
            let w = workload.load()?;
            let shim = Shim {
                cube_cores: cube,
                vector_cores: vector,
                sched,
                options: RunOptions {
                    issue_depth,
                    window,
                    symbols: Symbols::new(w.symbols()).context("too many symbols")?,
                    ..RunOptions::default()
                },
            };
            println!("workload  {}: {}", w.name(), w.summary());
            if let Some(line) = w.symbols_line() {
                println!("symbols   {line}");
            }
            let parsed =
                device_runtime::abi::Table::parse(w.table()).map_err(|e| anyhow::anyhow!("{e}"))?;
            let program = match parsed.program().len() {
                0 => String::new(),
                n => format!(" (a program of {n} instructions, expanded on the device)"),
            };
            println!(
                "table     {} tasks{program}, {} bytes, arena {} bytes",
                w.tasks(),
                w.table().len(),
                w.arena().bytes.len()
            );
            let mut arena = w.arena().clone();
            let stats = if semantic {
                println!(
                    "shim      semantic time on one host thread: {threads} scheduler threads ({}), {cube} cube + {vector} vector AICores",
                    policy.name()
                );
                let run = run_semantic_with(
                    w.table(),
                    &mut arena.bytes,
                    &shim.core_kinds(),
                    &sched,
                    &shim.options,
                )?;
                println!(
                    "ran       {} tasks, makespan {} cycles",
                    run.stats.tasks, run.makespan
                );
                run.stats
            } else {
                println!(
                    "shim      {threads} AICPU scheduler threads ({}), {cube} cube + {vector} vector AICore threads",
                    policy.name()
                );
                let stats = shim.run(w.table(), &mut arena.bytes)?;
                println!(
                    "ran       {} tasks in {:.3} ms wall",
                    stats.tasks,
                    stats.wall_micros() as f64 / 1000.0
                );
                stats
            };
            println!("policy    {}", stats.policy);
            for (set, t) in stats.tasksets.iter().enumerate() {
                if let (1.., Some(t)) = (set, t) {
                    println!(
                        "  taskset {set} (the program's): {}, key {}, placed {} tasks",
                        t.decision, t.key, t.placed
                    );
                }
            }
            println!("window    {} tasks in flight at most", stats.window);
            let ticks = if semantic { "cycles" } else { "ns" };
            for t in stats.threads() {
                println!(
                    "  thread {}: placed {:>5} issued {:>5} (shared {}, queued behind a running task {}) steals {}/{} tried, queue high-water {}, cores busy {} {ticks}",
                    t.thread, t.placed, t.issued, t.from_shared, t.queued, t.steals, t.steal_attempts, t.queue_high_water, t.busy_ticks
                );
            }
            for c in stats.cores() {
                let idle = stats.wall_ticks.saturating_sub(c.busy_ticks);
                println!(
                    "  core {} ({:?}, thread {}): {:>5} tasks {:>12} cycles, busy {} {ticks}, idle {} {ticks}",
                    c.core, c.kind, c.thread, c.tasks, c.cycles, c.busy_ticks, idle
                );
            }
            println!("  total semantic cycles {}", stats.total_cycles());
            print_stalls(&stats.stalls);
            Ok(report(&w, &arena, Some(stats.tasks as usize)))
        }
        Command::Build { workload, out } => {
            let w = workload.load()?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            std::fs::write(out.join("table.bin"), w.table()).context("writing table.bin")?;
            std::fs::write(out.join("arena.bin"), &w.arena().bytes).context("writing arena.bin")?;
            println!(
                "wrote {}/table.bin ({} tasks) and arena.bin ({} bytes)",
                out.display(),
                w.tasks(),
                w.arena().bytes.len()
            );
            if let Some(line) = w.symbols_line() {
                println!("the program's symbols, to bind at launch: {line}");
            }
            Ok(true)
        }
        Command::Verify { workload, arena } => {
            let w = workload.load()?;
            let bytes =
                std::fs::read(&arena).with_context(|| format!("reading {}", arena.display()))?;
            Ok(report(&w, &Arena { bytes }, None))
        }
        Command::Inspect {
            table,
            all,
            symbols,
        } => {
            let path = table.to_string_lossy().into_owned();
            let (bytes, file) = if path.ends_with(".toml") {
                let f = load_file(&path, &symbols)?;
                (f.table.clone(), Some(f))
            } else {
                if !symbols.is_empty() {
                    bail!("--symbol applies to workload files (FILE.toml)");
                }
                let bytes = std::fs::read(&table)
                    .with_context(|| format!("reading {}", table.display()))?;
                (bytes, None)
            };
            let text = inspect(&bytes, all);
            print!("{text}");
            if let Some(f) = file {
                let w = Loaded::File(Box::new(f));
                let with = w
                    .symbols_line()
                    .map_or(String::new(), |s| format!(" with {s}"));
                println!(
                    "the f64 reference expands the program{with} to {} tasks",
                    w.tasks()
                );
            }
            if !host_tools::inspect::is_valid(&bytes) {
                bail!("{} is not a valid table", table.display());
            }
            Ok(true)
        }
    }
}

/// Backpressure per resource: high-water mark against capacity, and stalls.
fn print_stalls(stalls: &device_runtime::orch::StallStats) {
    use device_runtime::orch::StallReason;
    for reason in [
        StallReason::TaskRingFull,
        StallReason::TensorMapPoolFull,
        StallReason::DepListPoolFull,
        StallReason::ReadyQueueFull,
    ] {
        let r = stalls.of(reason);
        println!(
            "  {:<20} high water {:>5} of {:>5}, {} stalls",
            reason.name(),
            r.high_water,
            r.capacity,
            r.stalls
        );
    }
}

/// Prints the check of `arena` (and of the task count, when the run's is
/// known) and whether it passed.
fn report(w: &Loaded, arena: &Arena, ran: Option<usize>) -> bool {
    let checks: Vec<Verification> = match w {
        Loaded::Named(w) => vec![w.verify(arena)],
        Loaded::File(f) => {
            println!("bound     {}", host_tools::workload_file::F32_BOUND);
            for note in &f.notes {
                println!("note      {note}");
            }
            let mut checks: Vec<Verification> =
                ran.map(|n| f.check_task_count(n)).into_iter().collect();
            checks.extend(f.check(arena));
            checks
        }
    };
    for v in &checks {
        println!("check     {v}");
    }
    let passed = checks.iter().all(Verification::passed);
    println!("{}", if passed { "PASS" } else { "FAIL" });
    passed
}
