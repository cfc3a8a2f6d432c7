//! `cargo xtask ci`: every check, fail-fast, timed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::{bindgen, cargo, dist, fw, launcher, qemu_bench, run, setup, target};

/// The steps in order. Host steps name `--workspace --exclude firmware`: the
/// firmware is a workspace member that only builds for its bare-metal target.
const STEPS: [(&str, Step); 17] = [
    ("setup", |_| setup::setup()),
    ("fmt", |root| {
        run(cargo(root).args(["fmt", "--all", "--", "--check"]))
    }),
    ("clippy (host)", |root| {
        run(cargo(root)
            .args([
                "clippy",
                "--workspace",
                "--exclude",
                "firmware",
                "--all-targets",
            ])
            .args(DENY))
    }),
    ("clippy (firmware)", |root| {
        run(target::for_target(cargo(root).args(["clippy", "-p", "firmware"])).args(DENY))
    }),
    // The AICPU program's device-only code (asm, the panic handler).
    ("clippy (aicpu)", |root| {
        run(dist::aicpu_cargo(root, "clippy").args(DENY))
    }),
    ("doc", doc),
    ("policy features", policy_features),
    ("bindgen --check", |root| bindgen::bindgen(root, true)),
    ("fw", |root| fw::fw(root).map(drop)),
    // The device artifacts, the AICPU .so checked, the header fresh.
    ("dist", |root| dist::dist(root, &dist::default_out(root))),
    ("bench (smoke)", bench),
    ("test", test),
    ("loom", loom),
    ("stress (release)", stress),
    ("release-size tests", release_size),
    ("miri", miri),
    ("fuzz", fuzz),
];

type Step = fn(&Path) -> Result<()>;

const DENY: [&str; 3] = ["--", "-D", "warnings"];

pub fn ci(root: &Path) -> Result<()> {
    let start = Instant::now();
    let mut times = Vec::new();
    for (name, step) in STEPS {
        eprintln!("==> ci: {name}");
        let t = Instant::now();
        let result = step(root);
        times.push((name, t.elapsed()));
        if let Err(e) = result {
            report(&times, start.elapsed());
            return Err(e.context(format!("ci step `{name}` failed")));
        }
    }
    report(&times, start.elapsed());
    eprintln!("ci: all steps passed");
    Ok(())
}

/// The API docs of every host-buildable crate without a rustdoc warning (a
/// broken or ambiguous intra-doc link, a public doc linking a private item):
/// `-D warnings` makes each an error. Dependencies are not documented, only
/// linked to.
fn doc(root: &Path) -> Result<()> {
    run(cargo(root)
        .args(["doc", "--no-deps", "--workspace", "--exclude", "firmware"])
        .env("RUSTDOCFLAGS", "-D warnings"))
}

/// The host tests; integration tests find the firmware in `WSP_FIRMWARE`
/// and the AICPU launcher's directory (built here) in `WSP_LAUNCHER`.
fn test(root: &Path) -> Result<()> {
    let launcher = launcher::build(root)?;
    let mut test = cargo(root);
    test.args(["test", "--workspace", "--exclude", "firmware"])
        .env("WSP_FIRMWARE", fw::elf_path(root))
        .env("WSP_LAUNCHER", launcher);
    run(&mut test)
}

/// The runtime built with fewer dispatch policies (cargo features): it
/// must build without warnings, and selecting a policy it left out must be
/// an error (the policy tests check both sides against the features).
fn policy_features(root: &Path) -> Result<()> {
    let runtime = ["-p", "device-runtime", "--no-default-features"];
    run(cargo(root)
        .arg("clippy")
        .args(runtime)
        .arg("--all-targets")
        .args(DENY))?;
    run(cargo(root).arg("test").args(runtime).arg("--lib"))?;
    run(cargo(root).arg("test").args(runtime).args([
        "--features",
        "policy-hash,policy-adaptive",
        "--lib",
        "policy",
    ]))
}

/// Model checks of the concurrent structures, in their own target directory
/// so that `--cfg loom` does not invalidate the main build.
fn loom(root: &Path) -> Result<()> {
    let mut test = cargo(root);
    test.args([
        "test",
        "-p",
        "device-runtime",
        "--release",
        "--lib",
        "--target-dir",
    ])
    .arg(root.join("target").join("loom"))
    .arg("loom")
    .env("RUSTFLAGS", "--cfg loom");
    run(&mut test)
}

/// The tests at the sizes the workloads ship with, which a debug build
/// (the `test` step's) leaves out as too slow: about 40 seconds in release.
fn release_size(root: &Path) -> Result<()> {
    let tests = [
        "moe_layer",
        "stitched",
        "decode",
        "sparse_decode",
        "decode_layer",
    ];
    let mut cargo = cargo(root);
    cargo.args(["test", "--release", "-p", "host-tools"]);
    for t in tests {
        cargo.args(["--test", t]);
    }
    run(&mut cargo)
}

/// The orchestrator's randomized stress test at full size (2 million tasks).
fn stress(root: &Path) -> Result<()> {
    run(cargo(root).args([
        "test",
        "--release",
        "-p",
        "device-runtime",
        "--test",
        "orch_stress",
    ]))
}

/// Builds and runs the benchmarks once (all but orchestration at their
/// `WSP_BENCH_SMOKE` sizes), so that they keep working; their figures
/// are recorded in BENCHMARKS.md, not judged here.
fn bench(root: &Path) -> Result<()> {
    run(cargo(root).args(["bench", "-p", "device-runtime", "--bench", "orchestration"]))?;
    let smoke = |package: &str, bench: &str| {
        run(cargo(root)
            .args(["bench", "-p", package, "--bench", bench])
            .env("WSP_BENCH_SMOKE", "1"))
    };
    smoke("device-runtime", "issue")?;
    smoke("device-runtime", "ring")?;
    smoke("host-tools", "scheduling")?;
    qemu_bench::qemu_bench(
        root,
        qemu_bench::SMOKE_TASKS,
        1,
        1,
        qemu_bench::Clock::Icount,
    )?;
    for bench in [
        "expansion",
        "channels",
        "validation",
        "small_runs",
        "decode_plan",
        "decode_scale",
    ] {
        smoke("host-tools", bench)?;
    }
    Ok(())
}

fn report(times: &[(&str, Duration)], total: Duration) {
    eprintln!("ci: step times");
    for (name, time) in times {
        eprintln!("  {name:<18} {:>7.1} s", time.as_secs_f64());
    }
    eprintln!("  {:<18} {:>7.1} s", "total", total.as_secs_f64());
}

/// `cargo +nightly ...`, through rustup's proxy, without the variables of
/// the stable cargo that runs xtask.
fn nightly(root: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("cargo");
    cmd.current_dir(root)
        .arg("+nightly")
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC");
    cmd
}

/// The nightly toolchain with `components`, installed if missing (an
/// installed nightly is left as it is: `rustup toolchain install` would
/// update it).
fn install_nightly(components: &[&str]) -> Result<()> {
    let rustup = || std::process::Command::new("rustup");
    let have = rustup()
        .args(["run", "nightly", "rustc", "--version"])
        .output();
    if !have.is_ok_and(|o| o.status.success()) {
        run(rustup().args(["toolchain", "install", "nightly", "--profile", "minimal"]))?;
    }
    if components.is_empty() {
        return Ok(());
    }
    run(rustup()
        .args(["component", "add", "--toolchain", "nightly"])
        .args(components))
}

/// Miri on the unit tests of the lock-free structures (the deque, the
/// mailbox, the ring), leaving out what Miri cannot run: the mailbox test
/// that calls the C kernels (FFI), and the deque's 200,000-task contention
/// test (hours under Miri; loom covers its interleavings); and on the
/// host's worker threads.
fn miri(root: &Path) -> Result<()> {
    install_nightly(&["miri", "rust-src"])?;
    let target = root.join("target").join("miri");
    run(nightly(root)
        .args([
            "miri",
            "test",
            "-p",
            "device-runtime",
            "--lib",
            "--target-dir",
        ])
        .arg(target)
        .args([
            "--",
            "steal_deque",
            "mailbox",
            "sched::ring",
            "orch::release",
        ])
        .args(["--skip", "issues_runs_and_completes_on_another_thread"])
        .args([
            "--skip",
            "every_task_is_taken_exactly_once_under_contention",
        ]))?;
    // The host's worker threads (`host_tools::workers`, the shim's only
    // `unsafe`: a job's lifetime erased until its scope has waited for
    // it). Idle workers outlive the tests by design: not a leak to report.
    run(nightly(root)
        .env("MIRIFLAGS", "-Zmiri-ignore-leaks")
        .args(["miri", "test", "-p", "host-tools", "--lib", "--target-dir"])
        .arg(root.join("target").join("miri"))
        .args(["--", "workers"]))
}

/// The fuzz targets (`fuzz/`), 20 s each with debug assertions, from the
/// checked-in corpus; new inputs go to a scratch corpus under `target/`.
/// Any crash, timeout (10 s for one input) or memory blow-up fails.
fn fuzz(root: &Path) -> Result<()> {
    install_nightly(&[])?;
    let have = nightly(root).args(["fuzz", "--version"]).output();
    if !have.is_ok_and(|o| o.status.success()) {
        run(nightly(root).args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let dir = root.join("fuzz");
    for target in ["table", "expand", "workload_file", "launch"] {
        let scratch = root.join("target").join("fuzz-corpus").join(target);
        std::fs::create_dir_all(&scratch)?;
        run(nightly(&dir)
            .args(["fuzz", "run", "-O", "-a", target])
            .arg(&scratch)
            .arg(dir.join("corpus").join(target))
            .args([
                "--",
                "-max_total_time=20",
                "-timeout=10",
                "-rss_limit_mb=2048",
            ]))?;
    }
    Ok(())
}
