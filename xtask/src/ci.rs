//! `cargo xtask ci`: every check, fail-fast, timed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::{bindgen, cargo, fw, run, setup, target};

/// The steps in order. Host steps name `--workspace --exclude firmware`: the
/// firmware is a workspace member that only builds for its bare-metal target.
const STEPS: [(&str, Step); 12] = [
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
    ("doc", doc),
    ("policy features", policy_features),
    ("bindgen --check", |root| bindgen::bindgen(root, true)),
    ("fw", |root| fw::fw(root).map(drop)),
    ("bench (smoke)", bench),
    ("test", test),
    ("loom", loom),
    ("stress (release)", stress),
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

/// The host tests; integration tests find the firmware in `WSP_FIRMWARE`.
fn test(root: &Path) -> Result<()> {
    let mut test = cargo(root);
    test.args(["test", "--workspace", "--exclude", "firmware"])
        .env("WSP_FIRMWARE", fw::elf_path(root));
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

/// Builds and runs the benchmarks once (scheduling at small sizes), so
/// that they keep working; their figures are recorded in BENCHMARKS.md,
/// not judged here.
fn bench(root: &Path) -> Result<()> {
    run(cargo(root).args(["bench", "-p", "device-runtime", "--bench", "orchestration"]))?;
    run(cargo(root)
        .args(["bench", "-p", "device-runtime", "--bench", "issue"])
        .env("WSP_BENCH_SMOKE", "1"))?;
    run(cargo(root)
        .args(["bench", "-p", "device-runtime", "--bench", "ring"])
        .env("WSP_BENCH_SMOKE", "1"))?;
    run(cargo(root)
        .args(["bench", "-p", "host-tools", "--bench", "scheduling"])
        .env("WSP_BENCH_SMOKE", "1"))?;
    run(cargo(root)
        .args(["bench", "-p", "host-tools", "--bench", "expansion"])
        .env("WSP_BENCH_SMOKE", "1"))
}

fn report(times: &[(&str, Duration)], total: Duration) {
    eprintln!("ci: step times");
    for (name, time) in times {
        eprintln!("  {name:<18} {:>7.1} s", time.as_secs_f64());
    }
    eprintln!("  {:<18} {:>7.1} s", "total", total.as_secs_f64());
}
