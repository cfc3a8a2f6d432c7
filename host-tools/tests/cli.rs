//! The `wsp` binary: its flags do what they say.

use std::path::PathBuf;
use std::process::{Command, Output};

fn wsp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_wsp"))
        .args(args)
        .output()
        .expect("wsp runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `workload` line of a run: its name and sizes.
fn workload_line(o: &Output) -> String {
    stdout(o)
        .lines()
        .find(|l| l.starts_with("workload"))
        .unwrap_or_default()
        .to_string()
}

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_seed_keeps_each_workloads_default_sizes() {
    for name in ["mlp", "moe"] {
        let plain = wsp(&["run", name, "--semantic"]);
        let seeded = wsp(&["run", name, "--semantic", "--seed", "2"]);
        assert!(plain.status.success(), "{name}: {}", stderr(&plain));
        assert!(
            seeded.status.success(),
            "{name} --seed 2: {}",
            stderr(&seeded)
        );
        assert_eq!(workload_line(&plain), workload_line(&seeded), "{name}");
    }
}

#[test]
fn sizes_equal_to_the_gemm_defaults_are_honoured() {
    let dir = scratch("sizes_equal_to_the_gemm_defaults_are_honoured");
    let out = dir.to_str().unwrap();
    let o = wsp(&["build", "mlp", "--out", out]);
    assert!(o.status.success(), "{}", stderr(&o));
    let small = std::fs::metadata(dir.join("arena.bin")).unwrap().len();
    let o = wsp(&[
        "build", "mlp", "--m", "256", "--n", "256", "--k", "256", "--out", out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let big = std::fs::metadata(dir.join("arena.bin")).unwrap().len();
    assert!(
        big > small,
        "256^3 given: arena {big} bytes, default {small}"
    );
}

#[test]
fn a_built_table_runs_on_the_shim_and_its_arena_verifies() {
    let dir = scratch("a_built_table_runs_on_the_shim_and_its_arena_verifies");
    let d = dir.to_str().unwrap();
    let (table, arena) = (format!("{d}/table.bin"), format!("{d}/arena.bin"));
    let out = format!("{d}/out.bin");
    let o = wsp(&["build", "gemm", "--out", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = wsp(&["run", &table, "--arena", &arena, "--out", &out]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ran       512 tasks"), "{}", stdout(&o));
    let o = wsp(&["verify", "gemm", "--arena", &out]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    // The unchanged input arena does not pass: the run computed the result.
    let o = wsp(&["verify", "gemm", "--arena", &arena]);
    assert!(!o.status.success(), "{}", stdout(&o));
    // Without --arena the table runs on zeroes (C = 0 x 0 = 0).
    let o = wsp(&["run", &table, "--out", &out, "--semantic"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read(&out).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn a_bad_table_is_refused_with_the_field_named() {
    let dir = scratch("a_bad_table_is_refused_with_the_field_named");
    let d = dir.to_str().unwrap();
    let o = wsp(&[
        "build", "gemm", "--m", "64", "--n", "64", "--k", "64", "--out", d,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = format!("{d}/table.bin");
    let mut bytes = std::fs::read(&table).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    std::fs::write(&table, &bytes).unwrap();
    let o = wsp(&["run", &table]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("invalid descriptor table: section `"),
        "{}",
        stderr(&o)
    );
    // A table's arena of the wrong size is refused too.
    let o = wsp(&[
        "build", "gemm", "--m", "64", "--n", "64", "--k", "64", "--out", d,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = wsp(&["run", &table, "--arena", &table]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("the table's arena is"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn flags_that_do_not_apply_are_errors() {
    let dir = scratch("flags_that_do_not_apply_are_errors");
    let d = dir.to_str().unwrap();
    let o = wsp(&[
        "build", "gemm", "--m", "64", "--n", "64", "--k", "64", "--out", d,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = format!("{d}/table.bin");
    let toml = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/workloads/moe.toml"
    );
    for (args, why) in [
        (
            vec!["run", "gemm", "--arena", &table],
            "--arena applies to a table",
        ),
        (
            vec!["run", "gemm", "--symbols", "3"],
            "--symbols applies to a table",
        ),
        (
            vec!["run", &table, "--seed", "2"],
            "--seed apply to built-in workloads",
        ),
        (
            vec!["run", &table, "--m", "32"],
            "--seed apply to built-in workloads",
        ),
        (
            vec!["run", &table, "--symbol", "a=1"],
            "bind a table's symbols by position",
        ),
        (
            vec!["run", &table, "--symbols", "3"],
            "the table's program reads 0",
        ),
        (
            vec!["run", toml, "--seed", "2"],
            "a workload file gives its own",
        ),
        (
            vec!["run", "moe", "--tile", "16"],
            "moe is not built in tiles",
        ),
        (
            vec!["run", "gemm", "--policy", "round-robin", "--key", "task"],
            "--key applies",
        ),
        (vec!["build", &table, "--out", d], "not a table"),
        (vec!["run", "nope"], "unknown workload `nope`"),
        (vec!["verify", &table, "--arena", &table], "not a table"),
    ] {
        let o = wsp(&args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr(&o).contains(why), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn inspect_counts_a_tables_tasks_with_the_symbols_given() {
    let dir = scratch("inspect_counts_a_tables_tasks_with_the_symbols_given");
    let d = dir.to_str().unwrap();
    let toml = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/workloads/gemm_dyn.toml"
    );
    let o = wsp(&["build", toml, "--out", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = format!("{d}/table.bin");
    // mt row tiles of 4 x 4 GEMM tiles each (4 column tiles, 4 along k), mt at most 8.
    let o = wsp(&["inspect", &table]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("between 0 and 128 tasks (depending on symbols not bound here)"),
        "{}",
        stdout(&o)
    );
    let o = wsp(&["inspect", &table, "--symbols", "4"]);
    assert!(
        stdout(&o).contains("expands to 64 tasks;"),
        "{}",
        stdout(&o)
    );
    let o = wsp(&["inspect", toml, "--symbol", "mt=3"]);
    assert!(
        stdout(&o).contains("expands to 48 tasks;"),
        "{}",
        stdout(&o)
    );
    // Each kind of input takes its own form of symbols.
    let o = wsp(&["inspect", toml, "--symbols", "3"]);
    assert!(
        stderr(&o).contains("--symbols applies to a table"),
        "{}",
        stderr(&o)
    );
    let o = wsp(&["inspect", &table, "--symbol", "mt=3"]);
    assert!(stderr(&o).contains("by position"), "{}", stderr(&o));
    let o = wsp(&["inspect", "gemm"]);
    assert!(
        stderr(&o).contains("is a built-in workload"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_pipeline_runs_at_a_depth_and_inspect_names_its_channels() {
    let o = wsp(&["run", "pipeline", "--depth", "0", "--semantic"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        workload_line(&o).contains("channels of depth 0"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    // --depth is the pipeline's.
    let o = wsp(&["run", "gemm", "--depth", "2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--depth applies to the pipeline"),
        "{}",
        stderr(&o)
    );
    let o = wsp(&["run", "pipeline", "--depth", "17"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("depth 17"), "{}", stderr(&o));
    // A workload file's inspect names its channels and processes.
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/workloads/pipeline.toml"
    );
    let o = wsp(&["inspect", file]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for want in [
        "declare channel 0 (to_compute): capacity 2, latency 0 ticks",
        "process loader {",
        "consume channel 0 (to_compute) as r",
        "expands to 24 tasks",
    ] {
        assert!(text.contains(want), "no `{want}` in\n{text}");
    }
}

/// The table line counts a table's task records and its program apart:
/// `mlp-scratch` has 48 task records and a program of one instruction (its
/// `HEAP`), `decode-layer-dense` only a program.
#[test]
fn the_table_line_tells_task_records_from_a_program() {
    let line = |o: &Output| {
        stdout(o)
            .lines()
            .find(|l| l.starts_with("table "))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let o = wsp(&["run", "mlp-scratch"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        line(&o).contains("48 task records and a program of 1 instruction,"),
        "{}",
        line(&o)
    );
    let o = wsp(&["run", "gemm"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!line(&o).contains("program"), "{}", line(&o));
}

#[test]
fn a_fault_ends_the_run_with_its_error() {
    let timeouts = ["--kernel-timeout-ms", "300", "--ack-timeout-ms", "100"];
    for (fault, says) in [
        (
            "no-ack:0:1",
            "core 0 did not acknowledge task 0 (kernel 2 (gemm_tile))",
        ),
        (
            "no-fin:0:k2",
            "task 0 (kernel 2 (gemm_tile)) on core 0 was acknowledged but did not finish",
        ),
        (
            "no-kernel:0:2",
            "kernel 2 (gemm_tile) is not built into core 0; task 0 calls it",
        ),
    ] {
        let mut args = vec!["run", "gemm", "--threads", "1", "--fault", fault];
        args.extend(timeouts);
        let o = wsp(&args);
        assert!(!o.status.success(), "{fault}: {}", stdout(&o));
        assert!(stderr(&o).contains(says), "{fault}: {}", stderr(&o));
    }
    // gemm runs no task on vector core 2.
    let o = wsp(&["run", "gemm", "--fault", "error:2:1:42"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--fault error:2:1:42 never hit"),
        "{}",
        stderr(&o)
    );
    let o = wsp(&["run", "gemm", "--fault", "hang:0:1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no-ack:CORE:TASK"), "{}", stderr(&o));
    let o = wsp(&["run", "gemm", "--semantic", "--fault", "no-ack:0:1"]);
    assert!(stderr(&o).contains("semantic time"), "{}", stderr(&o));
}
