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
    // Both paths in full, the arena's with its directory too; the size is
    // the file's on disk.
    let bytes = std::fs::metadata(&arena).unwrap().len();
    let wrote = format!("wrote {table} (512 tasks) and {arena} ({bytes} bytes)");
    assert!(stdout(&o).contains(&wrote), "{}", stdout(&o));
    let o = wsp(&["run", &table, "--arena", &arena, "--out", &out]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ran       512 tasks"), "{}", stdout(&o));
    let o = wsp(&["verify", "gemm", "--arena", &out]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    // The unchanged input arena does not pass: the run computed the result.
    let o = wsp(&["verify", "gemm", "--arena", &arena]);
    assert!(!o.status.success(), "{}", stdout(&o));
    // NaN outputs (every byte 0xff is a NaN f32) fail, and the figures
    // say NaN rather than an error of 0.
    let nan = format!("{d}/nan.bin");
    std::fs::write(
        &nan,
        vec![0xffu8; std::fs::metadata(&out).unwrap().len() as usize],
    )
    .unwrap();
    let o = wsp(&["verify", "gemm", "--arena", &nan]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("max abs err NaN, max rel err NaN, worst err/bound inf"),
        "{}",
        stdout(&o)
    );
    // The directory itself is not a workload, and wsp says what is.
    let o = wsp(&["run", d]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("a directory, not a workload"),
        "{}",
        stderr(&o)
    );
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

/// A table file with something appended (`cat table.bin garbage >
/// t2.bin`) is refused by `wsp run` and `wsp inspect`, naming the table's
/// length and the file's; it used to run, the bytes after the table
/// silently ignored.
#[test]
fn a_table_file_with_bytes_after_the_table_is_refused() {
    let dir = scratch("a_table_file_with_bytes_after_the_table_is_refused");
    let d = dir.to_str().unwrap();
    let o = wsp(&["build", "gemm", "--out", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut bytes = std::fs::read(dir.join("table.bin")).unwrap();
    let total = bytes.len();
    bytes.extend_from_slice(b"garbage\n");
    let t2 = format!("{d}/t2.bin");
    std::fs::write(&t2, &bytes).unwrap();
    let says = format!(
        "t2.bin: invalid descriptor table: section `header`, entry 0, field `total_len`: \
         the table is {total} bytes long, but {} bytes were given: 8 bytes follow it",
        total + 8
    );
    for command in ["run", "inspect"] {
        let o = wsp(&[command, &t2]);
        assert_eq!(o.status.code(), Some(1), "{command}: {}", stdout(&o));
        assert!(stderr(&o).contains(&says), "{command}: {}", stderr(&o));
    }
    // The table itself runs and inspects.
    let table = format!("{d}/table.bin");
    for args in [vec!["run", &table, "--semantic"], vec!["inspect", &table]] {
        let o = wsp(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
}

/// The ranges `wsp run --help` states are the runtime's (the help text is
/// written by hand and once said the window was 1 to 256 after it had
/// grown to 4,096), and a value just past one is refused.
#[test]
fn the_help_states_the_runtimes_limits() {
    let help = stdout(&wsp(&["run", "--help"]));
    // clap wraps lines: compare with the whitespace folded.
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let window = device_runtime::abi::TASK_WINDOW;
    let queue = device_runtime::sched::DISPATCH_QUEUE;
    let threads = device_runtime::sched::MAX_THREADS;
    for stated in [
        format!("(1 to {window}). Default: the workload program's, else {window}"),
        format!("Tasks one dispatch queue may hold (1 to {queue})"),
        format!("Scheduler threads (1 to {threads})"),
    ] {
        assert!(help.contains(&stated), "`{stated}` not in: {help}");
    }
    for (flag, past) in [
        ("--window", window + 1),
        ("--queue-depth", queue + 1),
        ("--threads", threads + 1),
    ] {
        let o = wsp(&["run", "gemm", "--semantic", flag, &past.to_string()]);
        assert!(!o.status.success(), "{flag} {past} succeeded");
        let limit = format!("1 to {}", past - 1);
        assert!(stderr(&o).contains(&limit), "{flag} {past}: {}", stderr(&o));
    }
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
            "the table's program reads 0 (leave out --symbols)",
        ),
        (
            vec!["run", toml, "--seed", "2"],
            "a workload file gives its own",
        ),
        (
            vec!["run", "moe", "--tile", "16"],
            "--tile: moe does not take it (it is not built in tiles",
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
    // More values than the program reads would be dropped unread; a
    // name bound twice would keep one of them: both refused.
    let o = wsp(&["inspect", &table, "--symbols", "2,3"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("--symbols: 2 given; the table's program reads 1"),
        "{}",
        stderr(&o)
    );
    for command in ["inspect", "run"] {
        let o = wsp(&[command, toml, "--symbol", "mt=2", "--symbol", "mt=3"]);
        assert_eq!(o.status.code(), Some(1), "{command}: {}", stdout(&o));
        assert!(
            stderr(&o).contains("--symbol mt is given twice (mt=2 and mt=3)"),
            "{command}: {}",
            stderr(&o)
        );
    }
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
    // Long enough that a healthy core the host stops for a moment is not
    // taken for a hung one; each faulty run waits about one of them, and
    // the drain after the error up to the kernel timeout.
    let timeouts = ["--kernel-timeout-ms", "1500", "--ack-timeout-ms", "600"];
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

/// Every command tells a workload file from a table the same way: a file
/// not named `.toml` is a workload file unless it is a table (named `.bin`
/// or starting with the table magic). `inspect` used to read any file not
/// named `.toml` as a table ("bad magic").
#[test]
fn a_workload_file_of_any_name_is_one_for_every_command() {
    let dir = scratch("a_workload_file_of_any_name_is_one_for_every_command");
    let d = dir.to_str().unwrap();
    let toml = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/workloads/gemm_dyn.toml"
    );
    let file = format!("{d}/gemm_dyn.txt");
    std::fs::copy(toml, &file).unwrap();
    // mt = 4 row tiles (its default) or 3, of 4 column tiles x 4 along k.
    let o = wsp(&["inspect", &file]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("the f64 reference expands the program with mt = 4 to 64 tasks"),
        "{}",
        stdout(&o)
    );
    let o = wsp(&["inspect", &file, "--symbol", "mt=3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("expands to 48 tasks;"),
        "{}",
        stdout(&o)
    );
    // run, build and verify take it too.
    let after = format!("{d}/after.bin");
    let o = wsp(&["run", &file, "--out", &after]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    let o = wsp(&["verify", &file, "--arena", &after]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    let o = wsp(&["build", &file, "--out", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A table not named .bin is a table by its magic, for inspect as for run.
    let table = format!("{d}/table.dat");
    std::fs::rename(format!("{d}/table.bin"), &table).unwrap();
    let o = wsp(&["inspect", &table, "--symbols", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("expands to 64 tasks;"),
        "{}",
        stdout(&o)
    );
    let o = wsp(&["run", &table, "--symbols", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A registry kernel the workload-file check has no reference for is an
/// error naming its place and the kernels a file can call, for run, build
/// and inspect alike: not a panic (exit 101) as it used to be.
#[test]
fn a_kernel_without_a_reference_is_an_error_not_a_panic() {
    let dir = scratch("a_kernel_without_a_reference_is_an_error_not_a_panic");
    let file = dir.join("sq.toml");
    std::fs::write(
        &file,
        r#"name = "sq"
summary = "square a tile"

[tensors]
x = { shape = [32, 32], init = "random", seed = 1 }
y = { shape = [32, 32] }

[[body]]
call = "square"
args = ["x", "y"]
"#,
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let out = dir.join("out");
    for args in [
        vec!["run", file],
        vec!["build", file, "--out", out.to_str().unwrap()],
        vec!["inspect", file],
    ] {
        let o = wsp(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(
                "line 9, column 8: kernel `square` has no f64 reference to check a run \
                 against, so a workload file cannot call it (kernels a workload file can \
                 call: add, gemm_tile, rmsnorm, softmax, route_topk, expert_rows)"
            ),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

/// A task whose written argument overlaps another is refused, the two
/// named by their positions in the task as written: the orchestrator
/// numbers only the arguments it tracks (not those on read-only tensors),
/// and the report used to pass its numbers on ("argument 1 ... argument 0"
/// for add(A, B, A)). A workload file is refused before it runs.
#[test]
fn an_overlapping_argument_is_named_by_its_place_in_the_task() {
    use host_tools::program::Workload;
    use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;
    let dir = scratch("an_overlapping_argument_is_named_by_its_place_in_the_task");
    // (tensor of each argument: 0 = A, written by the task; 1 = B, read
    // only), and the pair the refusal names.
    for (tensors, says) in [
        (
            [0, 1, 0],
            "argument 2 writes a region overlapping argument 0",
        ),
        (
            [1, 0, 0],
            "argument 2 writes a region overlapping argument 1",
        ),
    ] {
        let mut w = Workload::new();
        let ids = [
            w.tensor("A", &[4, 4]).unwrap(),
            w.tensor("B", &[4, 4]).unwrap(),
        ];
        let args: Vec<_> = tensors.iter().map(|&t| ids[t].tile(0, 0, 4, 4)).collect();
        w.call(ADD, &args, &[]);
        let table = dir.join(format!("t{}{}{}.bin", tensors[0], tensors[1], tensors[2]));
        std::fs::write(&table, w.finish().unwrap()).unwrap();
        let o = wsp(&["run", table.to_str().unwrap()]);
        assert!(!o.status.success(), "{tensors:?}: {}", stdout(&o));
        assert!(
            stderr(&o).contains(&format!(
                "task 0 passed validation but the orchestrator refused it: {says}"
            )),
            "{tensors:?}: {}",
            stderr(&o)
        );
    }
    // The file form of add(A, B, A): refused at the written argument.
    let file = dir.join("self.toml");
    std::fs::write(
        &file,
        r#"name = "self"

[tensors]
A = { shape = [4, 4], init = "random", seed = 1 }
B = { shape = [4, 4], init = "random", seed = 2 }

[[body]]
call = "add"
args = ["A", "B", "A"]
"#,
    )
    .unwrap();
    for command in ["run", "inspect"] {
        let o = wsp(&[command, file.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{command}: {}", stdout(&o));
        assert!(
            stderr(&o).contains(
                "line 9, column 19: call add: argument 2 (c) writes a region of `A` \
                 overlapping argument 0 (a)"
            ),
            "{command}: {}",
            stderr(&o)
        );
    }
}

/// Counts and sizes a host cannot honour end with an error naming them, not
/// a panic (exit 101) or an abort (134): a core count past what the
/// scheduler threads drive (checked before a thread is started for each
/// core), and a table whose header claims an arena no host can allocate.
#[test]
fn sizes_past_the_hosts_are_errors_not_aborts() {
    for (args, why) in [
        (
            vec!["run", "gemm", "--cube", "18446744073709551615"],
            "a thread drives at most 64",
        ),
        (
            vec![
                "run",
                "gemm",
                "--cube",
                "130",
                "--vector",
                "0",
                "--threads",
                "2",
            ],
            "scheduler thread 0 has 65 cores; a thread drives at most 64",
        ),
        (
            vec!["run", "gemm", "--cube", "300", "--semantic"],
            "scheduler thread 0 has 151 cores", // 300 cube + 2 vector cores
        ),
    ] {
        let o = wsp(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(why), "{args:?}: {}", stderr(&o));
    }
    // 126 cube + 2 vector cores: 64 a thread.
    let o = wsp(&[
        "run",
        "gemm",
        "--cube",
        "126",
        "--threads",
        "2",
        "--semantic",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));

    let dir = scratch("sizes_past_the_hosts_are_errors_not_aborts");
    let d = dir.to_str().unwrap();
    let o = wsp(&[
        "build", "gemm", "--m", "64", "--n", "64", "--k", "64", "--out", d,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let path = dir.join("table.bin");
    let mut table = std::fs::read(&path).unwrap();
    let at = std::mem::offset_of!(device_runtime::abi::TableHeader, arena_size);
    table[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    host_tools::table::seal(&mut table);
    std::fs::write(&path, &table).unwrap();
    let o = wsp(&["run", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let want = format!(
        "the table's arena is {} bytes, more than this host can allocate",
        1u64 << 62
    );
    assert!(stderr(&o).contains(&want), "{}", stderr(&o));
}

/// Built-in workloads' sizes past the bounds (1 GiB of tensors, 2^20
/// tasks) are refused before anything is built, naming the sizes, what
/// they need and the bound: an error (exit 1), not an abort on a failed
/// allocation (134) or a run of hours, for every workload that reads an
/// unbounded size. (`budget`'s unit tests check the bounds to the byte
/// and the task; a size 64 times the default is still built.)
#[test]
fn built_in_sizes_past_the_bounds_are_errors_not_aborts() {
    let bytes = "a built-in workload may take at most 1073741824 (1 GiB)";
    let tasks = "a built-in workload may run at most 1048576 (2^20)";
    for (args, says) in [
        (
            vec!["run", "decode", "--m", "65536"],
            "m = 65536, n = 8192, k = 128, tile = 16 need up to 4597120 tasks",
        ),
        (vec!["run", "decode", "--m", "4294967295"], tasks),
        (vec!["run", "decode-uniform", "--n", "100000"], bytes),
        (vec!["run", "decode-device", "--tile", "100000000"], bytes),
        (
            vec!["build", "sparse-decode", "--m", "100000000", "--out", "x"],
            tasks,
        ),
        (vec!["run", "gemm", "--m", "65536", "--n", "65536"], tasks),
        (
            vec![
                "run", "gemm", "--m", "262144", "--n", "1024", "--k", "64", "--tile", "64",
            ],
            bytes,
        ),
        (
            vec![
                "run", "mlp", "--m", "1048576", "--k", "1024", "--tile", "64",
            ],
            bytes,
        ),
        (vec!["run", "streams", "--k", "4194304"], tasks),
        (vec!["run", "pipeline", "--m", "4294967232"], tasks),
        (
            vec!["run", "pipeline", "--m", "4294967232", "--depth", "4"],
            tasks,
        ),
        (
            vec!["run", "attention-pipeline", "--n", "4294967232"],
            tasks,
        ),
        // ffn at its most (MAX_FFN, 2^15) over 4096 tokens: 8 experts each
        // and 64 x 15 padding rows in tiles of 16 make 2108 expert tiles of
        // 1 + 3 x 512 x 2 + 512 tasks, past 2^20 alone.
        (
            vec![
                "verify",
                "moe-layer",
                "--m",
                "4096",
                "--n",
                "32768",
                "--arena",
                "x",
            ],
            tasks,
        ),
        // An ffn past MAX_FFN is the config's refusal.
        (
            vec!["verify", "moe-layer", "--n", "1048576", "--arena", "x"],
            "ffn = 1048576 must be in 1..=64 or a multiple of 64 up to 32768",
        ),
        (vec!["run", "decode-layer", "--n", "100000000"], tasks),
        // Pages of 65536 tokens, the device planner's largest.
        (vec!["run", "decode-layer-dense", "--tile", "65536"], bytes),
        (vec!["run", "stitched", "--tile", "65536"], bytes),
    ] {
        let o = wsp(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    // A request count past the decode layer's is refused as before, by
    // the layer (before a length is listed for each request).
    let o = wsp(&["run", "decode-layer", "--m", "4000000000"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("m = 4000000000 requests: the layer takes 1 ..= 256"),
        "{}",
        stderr(&o)
    );
    // 64 times pipeline's default tiles (512 of 64 x 64) is built.
    let dir = scratch("built_in_sizes_past_the_bounds_are_errors_not_aborts");
    let o = wsp(&[
        "build",
        "pipeline",
        "--m",
        "32768",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("(1536 tasks)"), "{}", stdout(&o));
}

/// A table with `n` tasks: `add` on one tile in each iteration of a loop
/// bound by symbol 0 (at most 2^32 - 1); with `overlap`, each task's
/// output is its first input.
fn table_of_symbol_tasks(path: &std::path::Path, overlap: bool) {
    use host_tools::program::{Axis, Workload};
    use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;
    let mut w = Workload::new();
    let a = w.tensor("A", &[4, 4]).unwrap();
    let b = w.tensor("B", &[4, 4]).unwrap();
    let c = w.tensor("C", &[4, 4]).unwrap();
    let out = if overlap { a } else { c };
    let axis = Axis::DenseDyn {
        symbol: 0,
        max: u32::MAX,
    };
    w.parallel(axis, |w, _| {
        let args = [a, b, out].map(|t| t.tile(0, 0, 4, 4));
        w.call(ADD, &args, &[]);
    });
    std::fs::write(path, w.finish().unwrap()).unwrap();
}

/// `wsp run TABLE.bin --symbols`: symbols that make the program expand to
/// more tasks than a run on the shim takes (2^22) are refused before the
/// run, naming the count and the bound; fewer run. At the bound exactly
/// the count passes the check (counted, not run: 2^22 tasks take a
/// minute in a debug build).
#[test]
fn symbols_that_ask_for_too_many_tasks_are_refused() {
    use host_tools::task_count::{count_tasks, MAX_SHIM_TASKS};
    let dir = scratch("symbols_that_ask_for_too_many_tasks_are_refused");
    let table = dir.join("t.bin");
    table_of_symbol_tasks(&table, false);
    let path = table.to_str().unwrap();
    for symbol in ["4194305", "4294967295"] {
        let o = wsp(&["run", path, "--symbols", symbol, "--semantic"]);
        assert_eq!(o.status.code(), Some(1), "{symbol}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!(
                "with --symbols {symbol}: it expands to {symbol} tasks; a run on the host \
                 shim takes at most 4194304 (2^22)"
            )),
            "{symbol}: {}",
            stderr(&o)
        );
    }
    let o = wsp(&["run", path, "--symbols", "3", "--semantic"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ran       3 tasks"), "{}", stdout(&o));
    let bytes = std::fs::read(&table).unwrap();
    let parsed = device_runtime::abi::Table::parse(&bytes).unwrap();
    let at = MAX_SHIM_TASKS as i64;
    let count = |n: i64| count_tasks(&parsed, None, &[n]).unwrap();
    assert_eq!(count(at).check_shim_limit(), Ok(()));
    assert!(count(at + 1).check_shim_limit().is_err());
}

/// A workload file without a kernel call (empty, only tensors, or only
/// loops) is refused by every command that takes one: it used to build an
/// empty table, run it and print PASS.
#[test]
fn a_workload_file_without_kernel_calls_is_refused() {
    let dir = scratch("a_workload_file_without_kernel_calls_is_refused");
    let arena = dir.join("arena.bin");
    std::fs::write(&arena, [0u8; 64]).unwrap();
    let out = dir.join("out");
    for (file, text) in [
        ("empty.toml", ""),
        ("tensors.toml", "name = \"t\"\n[tensors]\nA = { shape = [4, 4] }\n"),
        (
            "loop.toml",
            "[tensors]\nA = { shape = [4, 4] }\n\n[[body]]\nparallel = \"i\"\ndense = 4\nbody = []\n",
        ),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap();
        for args in [
            vec!["run", path],
            vec!["build", path, "--out", out.to_str().unwrap()],
            vec!["inspect", path],
            vec!["verify", path, "--arena", arena.to_str().unwrap()],
        ] {
            let o = wsp(&args);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stdout(&o));
            assert!(
                stderr(&o).contains(&format!(
                    "{path}: the file has no kernel calls: a workload's body must call at \
                     least one kernel"
                )),
                "{args:?}: {}",
                stderr(&o)
            );
            assert!(!stdout(&o).contains("PASS"), "{args:?}: {}", stdout(&o));
        }
    }
}

/// A size flag a built-in workload does not read is refused, naming the
/// flags and why: `attention-pipeline` used to run the same with any
/// `--k` and `--tile`; v9's examples have fixed sizes. The sizes it reads
/// change it.
#[test]
fn size_flags_a_workload_does_not_read_are_refused() {
    for (args, says) in [
        (
            vec!["run", "attention-pipeline", "--k", "32"],
            "--k: attention-pipeline does not take it (its head dimension and KV tile are \
             fixed at 64)",
        ),
        (
            vec![
                "build",
                "attention-pipeline",
                "--k",
                "64",
                "--tile",
                "16",
                "--out",
                "x",
            ],
            "--k, --tile: attention-pipeline does not take them",
        ),
        (
            vec!["run", "wsp9-bgemm", "--m", "64"],
            "--m: wsp9-bgemm does not take it (v9's examples have fixed sizes",
        ),
        (
            vec!["run", "moe-var", "--n", "32", "--tile", "8"],
            "--tile: moe-var does not take it",
        ),
    ] {
        let o = wsp(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let o = wsp(&[
        "run",
        "attention-pipeline",
        "--m",
        "4",
        "--n",
        "192",
        "--semantic",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        workload_line(&o).contains("4 queries over 3 KV tiles of 64"),
        "{}",
        workload_line(&o)
    );
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    // The library refuses another head dimension or tile too.
    let p = host_tools::workloads::Params {
        k: 32,
        ..host_tools::workloads::Params::of("attention-pipeline").unwrap()
    };
    let e = host_tools::attention_pipeline::attention_pipeline(p, 2)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("k = 32 and tile = 64 must be 64"),
        "{e}"
    );
}

/// Semantic time honours `--kernel-timeout-ms`: 0 ms ends the run at its
/// first task, as on the shim's threads (it used to be ignored); the
/// acknowledgement timeout, which no semantic core can reach, is refused
/// with `--semantic` and still applies without. (`semantic`'s unit tests
/// put the timeout either side of a kernel's cycles.)
#[test]
fn semantic_time_honours_the_kernel_timeout() {
    // gemm's 32-tiles take 36,864 cycles each: well within a millisecond;
    // decode's first partial (a 2,064-token chunk of an 8K request) takes
    // more.
    let o = wsp(&["run", "gemm", "--semantic", "--kernel-timeout-ms", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = wsp(&[
        "run",
        "decode",
        "--m",
        "8",
        "--semantic",
        "--kernel-timeout-ms",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains(
            "task 0 (kernel 7 (attn_decode_partial)) on core 0 was acknowledged but did not \
             finish within 1 ms"
        ),
        "{}",
        stderr(&o)
    );
    let o = wsp(&["run", "gemm", "--semantic", "--ack-timeout-ms", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("--ack-timeout-ms: in semantic time a core takes its task the moment"),
        "{}",
        stderr(&o)
    );
}

/// A timeout of 0 ms is refused naming the flag, on the shim and in
/// semantic time: it used to be taken, and the run then blamed a healthy
/// core (`core 0 did not acknowledge task 0 ... within 0 ms`, or every
/// task overrunning its kernel timeout).
#[test]
fn a_timeout_of_0_ms_is_refused_naming_the_flag() {
    let kernel = "--kernel-timeout-ms 0: a kernel timeout (kernel_timeout_ms) of 0 ms; \
                  at least 1 ms is needed";
    let ack = "--ack-timeout-ms 0: an acknowledgement timeout (ack_timeout_ms) of 0 ms; \
               at least 1 ms is needed";
    for (args, says) in [
        (&["--kernel-timeout-ms", "0"][..], kernel),
        (&["--kernel-timeout-ms", "0", "--semantic"][..], kernel),
        (&["--ack-timeout-ms", "0"][..], ack),
    ] {
        let mut all = vec!["run", "gemm"];
        all.extend(args);
        let o = wsp(&all);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stdout(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert!(
            !stderr(&o).contains("did not acknowledge") && !stdout(&o).contains("ran "),
            "{args:?}: refused before the run: {}{}",
            stdout(&o),
            stderr(&o)
        );
    }
}

/// `wsp inspect TABLE.bin` expands a program with the symbols given and
/// refuses a task whose written argument overlaps another of its
/// arguments, as a run does (it used to call the table valid); where it
/// cannot expand the program (a symbol not given) it says that a run's
/// expansion checks the arguments.
#[test]
fn inspect_refuses_a_program_task_whose_arguments_overlap() {
    let dir = scratch("inspect_refuses_a_program_task_whose_arguments_overlap");
    let (bad, good) = (dir.join("bad.bin"), dir.join("good.bin"));
    table_of_symbol_tasks(&bad, true);
    table_of_symbol_tasks(&good, false);
    let (bad, good) = (bad.to_str().unwrap(), good.to_str().unwrap());
    let o = wsp(&["inspect", bad, "--symbols", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    // The dump lists the call at pc 3, its output (pc 6) on A as its
    // first input (pc 4).
    assert!(
        stdout(&o).contains("     3      call add"),
        "{}",
        stdout(&o)
    );
    let why = "task 0 (the call at instruction 3): argument 2 writes a region of `A` \
               overlapping argument 0";
    assert!(
        stdout(&o).contains(&format!(
            "a run fails: the program's expansion fails ({why})"
        )),
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains(&format!(
            "{bad}: the table is valid, but a run of it fails: the program's expansion fails \
             ({why})"
        )),
        "{}",
        stderr(&o)
    );
    // A run refuses it where inspect said.
    let o = wsp(&["run", bad, "--symbols", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("argument 2 writes a region overlapping argument 0"),
        "{}",
        stderr(&o)
    );
    // Without the symbol neither table is expanded: both pass, saying so.
    let note = "not expanded here (symbols not bound here decide its loops): a run's \
                expansion refuses a program task whose written argument overlaps another of \
                its arguments";
    for table in [bad, good] {
        let o = wsp(&["inspect", table]);
        assert!(o.status.success(), "{table}: {}", stderr(&o));
        assert!(stdout(&o).contains(note), "{table}: {}", stdout(&o));
    }
    // The table without the overlap is expanded and passes, with no note.
    let o = wsp(&["inspect", good, "--symbols", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("expands to 2 tasks;"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("not expanded here"), "{}", stdout(&o));
}

/// A workload file whose calls are all skipped for its symbols builds (a
/// table may be run with other symbols), but `wsp run` and `wsp verify`
/// fail saying nothing ran: they used to print PASS for 0 tasks.
#[test]
fn a_run_of_no_task_fails() {
    let dir = scratch("a_run_of_no_task_fails");
    let path = dir.join("skipped.toml");
    std::fs::write(
        &path,
        "[tensors]\nA = { shape = [4, 4], init = \"random\", seed = 1 }\nC = { shape = [4, 4] }\n\n\
         [[body]]\nwhen = \"0\"\nthen = [\n  { call = \"add\", args = [\"A\", \"A\", \"C\"] },\n]\n",
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let out = dir.join("out");
    let o = wsp(&["build", path, "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let arena = out.join("arena.bin");
    for args in [
        vec!["run", path],
        vec!["verify", path, "--arena", arena.to_str().unwrap()],
    ] {
        let o = wsp(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stdout(&o));
        let text = stdout(&o);
        assert!(
            text.contains(
                "check     nothing ran: the program skips every call (a `when` of 0, a loop of 0 \
                 iterations), so its reference has no task"
            ),
            "{args:?}: {text}"
        );
        assert!(text.lines().any(|l| l == "FAIL"), "{args:?}: {text}");
        assert!(!text.contains("PASS"), "{args:?}: {text}");
    }
}

#[test]
fn decode_layer_workloads_take_a_layer_count() {
    let small = ["--m", "4", "--n", "40", "--k", "64", "--semantic"];
    let run = |layers: &str| {
        let mut args = vec!["run", "decode-layer-dense", "--layers", layers];
        args.extend(small);
        wsp(&args)
    };
    let o = run("5");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(workload_line(&o).contains("5 layers"), "{}", stdout(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    let o = run("0");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("0 layers"), "{}", stderr(&o));
    // Only the decode-layer workloads have layers.
    let o = wsp(&["run", "gemm", "--layers", "2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("gemm has no layers to set"),
        "{}",
        stderr(&o)
    );
    // The layers count against the bounds, and the error names them:
    // each MoE layer at the default sizes holds 64 experts' weights of
    // 3 x 512 x 128 f32 (50 MB), so 40 layers pass 1 GiB.
    let o = wsp(&["run", "decode-layer", "--layers", "40"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("layers = 40 need") && stderr(&o).contains("at most 1073741824"),
        "{}",
        stderr(&o)
    );
}
