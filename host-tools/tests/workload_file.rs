//! Workload files: the examples parse, lower, run on the shim and pass the
//! f64 check; the MoE file is the built-in `moe` workload; malformed files
//! are refused with errors that name the mistake and its place; a wrong
//! result fails the check.

use std::path::{Path, PathBuf};

use device_runtime::abi::launch::Symbols;
use device_runtime::sched::RunOptions;
use host_tools::shim::Shim;
use host_tools::table::Arena;
use host_tools::workload_file::{ErrorKind, FileError, FileWorkload, WorkloadFile};

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workloads");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

fn example(name: &str) -> WorkloadFile {
    let path = examples()
        .into_iter()
        .find(|p| p.file_stem().unwrap() == name)
        .unwrap_or_else(|| panic!("no example {name}"));
    WorkloadFile::load(&path).unwrap()
}

/// Runs `w` on the shim (its symbols bound) and returns the arena and the
/// number of tasks that ran.
fn run(w: &FileWorkload) -> (Arena, usize) {
    let shim = Shim {
        options: RunOptions {
            symbols: Symbols::new(&w.symbols).unwrap(),
            ..RunOptions::default()
        },
        ..Shim::default()
    };
    let mut arena = w.arena.clone();
    let stats = shim.run(&w.table, &mut arena.bytes).unwrap();
    (arena, stats.tasks as usize)
}

fn passes(w: &FileWorkload, arena: &Arena) -> bool {
    w.check(arena).iter().all(|v| v.passed())
}

fn report(w: &FileWorkload, arena: &Arena) -> String {
    w.check(arena)
        .iter()
        .map(|v| format!("{v}\n"))
        .collect::<String>()
}

#[test]
fn every_example_runs_and_passes_the_f64_check() {
    let files = examples();
    assert!(files.len() >= 3, "{files:?}");
    for path in files {
        let file = WorkloadFile::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let w = file.build(&[]).unwrap();
        let (arena, ran) = run(&w);
        assert_eq!(ran, w.tasks.len(), "{}", path.display());
        assert!(w.check_task_count(ran).passed());
        assert!(
            passes(&w, &arena),
            "{}:\n{}",
            path.display(),
            report(&w, &arena)
        );
        // Every example computes something.
        assert!(arena.bytes != w.arena.bytes, "{}", path.display());
        // The reference's tasks are the host reference expansion's (of the
        // program the file lowered to, reading the run's data), in order;
        // that expansion does not follow channels (a pipeline's reference
        // takes its order from the expander instead).
        match w.program().expand(&arena, &w.symbols) {
            Ok(expanded) => assert_eq!(w.tasks, expanded, "{}", path.display()),
            Err(e) => {
                assert!(
                    !w.program().csp_names().channels.is_empty(),
                    "{}: {e}",
                    path.display()
                );
                assert!(e.contains("processes and channels"), "{e}");
            }
        }
    }
}

#[test]
fn a_symbol_sets_the_dense_dyn_axis() {
    let file = example("gemm_dyn");
    assert_eq!(file.symbol_names(), ["mt"]);
    // mt = 0 runs nothing, which does not pass (see
    // `a_run_of_no_task_does_not_pass`).
    let w = file.build(&[("mt".into(), 0)]).unwrap();
    let (arena, ran) = run(&w);
    assert_eq!((w.tasks.len(), ran), (0, 0));
    assert!(!passes(&w, &arena));
    assert_eq!(arena.bytes, w.arena.bytes);
    for mt in [1, 5, 8] {
        let w = file.build(&[("mt".into(), mt)]).unwrap();
        assert_eq!(w.symbols, [mt]);
        assert_eq!(w.tasks.len(), mt as usize * 16, "mt = {mt}");
        let (arena, ran) = run(&w);
        assert_eq!(ran, w.tasks.len());
        assert!(passes(&w, &arena), "mt = {mt}:\n{}", report(&w, &arena));
        // Rows of C from 32 * mt on stay zero; rows before are written.
        let c = w.tensors.iter().find(|t| t.name == "C").unwrap();
        let values = arena.read_f32(c);
        let cols = c.shape[1] as usize;
        let split = 32 * mt as usize * cols;
        assert!(values[split..].iter().all(|&v| v == 0.0));
        assert!(values[..split].iter().all(|&v| v != 0.0));
    }
    let e = file.build(&[("mt".into(), 9)]).err().unwrap();
    assert_eq!(e.kind, ErrorKind::Symbol);
    assert!(e.message.contains("`mt` = 9 is outside [0, 8]"), "{e}");
    let e = file.build(&[("rows".into(), 2)]).err().unwrap();
    assert!(
        e.message.contains("unknown symbol `rows` (symbols: mt)"),
        "{e}"
    );
}

#[test]
fn the_ragged_example_chooses_its_tile_size_by_length() {
    let w = example("ragged_norm").build(&[]).unwrap();
    // blocks = [3, 8, 0, 5]: 3 one-block tasks; 4 16-row tasks; none; 3
    // tasks of 16, 16 and 8 rows.
    let rows: Vec<u32> = w.tasks.iter().map(|t| t.args[0].2[1]).collect();
    assert_eq!(rows, [8, 8, 8, 16, 16, 16, 16, 16, 16, 8]);
    let (arena, _) = run(&w);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
}

#[test]
fn the_moe_file_is_the_builtin_moe_workload() {
    use host_tools::workloads::{Params, Workload};
    let builtin = Workload::build("moe", Params::of("moe").unwrap()).unwrap();
    let w = example("moe").build(&[]).unwrap();
    assert!(w.table == builtin.table, "the same program and table bytes");
    assert_eq!(w.tensors, builtin.tensors);
    assert!(w.arena.bytes == builtin.arena.bytes, "the same data");
    let (arena, ran) = run(&w);
    assert_eq!(ran, builtin.tasks);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
    // Both checks agree on the run.
    assert!(builtin.verify(&arena).passed());
    assert!(w.notes.is_empty(), "{:?}", w.notes);
}

#[test]
fn a_wrong_result_fails_the_check() {
    let w = example("gemm_dyn").build(&[]).unwrap();
    let (good, _) = run(&w);
    assert!(passes(&w, &good));
    let c = w.tensors.iter().find(|t| t.name == "C").unwrap().clone();
    // One element of C off by 1e-3: far above its f32 bound.
    let mut bad = good.clone();
    let mut values = bad.read_f32(&c);
    values[129] += 1e-3;
    bad.write_f32(&c, &values);
    let checks = w.check(&bad);
    let failed: Vec<&str> = checks
        .iter()
        .filter(|v| !v.passed())
        .map(|v| v.output.as_str())
        .collect();
    assert_eq!(failed, ["C"], "{}", report(&w, &bad));
    // A write to a tensor no task writes.
    let a = w.tensors.iter().find(|t| t.name == "A").unwrap().clone();
    let mut bad = good.clone();
    let mut values = bad.read_f32(&a);
    values[0] = -values[0];
    bad.write_f32(&a, &values);
    let report_text = report(&w, &bad);
    assert!(!passes(&w, &bad));
    assert!(report_text.contains("A changed"), "{report_text}");
    // Fewer tasks than the reference.
    assert!(!w.check_task_count(w.tasks.len() - 1).passed());

    // The router's i32 output: two tokens swapped.
    let w = example("moe").build(&[]).unwrap();
    let (good, _) = run(&w);
    let tokens = w
        .tensors
        .iter()
        .find(|t| t.name == "tokens")
        .unwrap()
        .clone();
    let mut chosen = good.read_i32(&tokens);
    let other = 1 + chosen[1..].iter().position(|&t| t != chosen[0]).unwrap();
    chosen.swap(0, other);
    let mut bad = good.clone();
    bad.write_i32(&tokens, &chosen);
    let text = report(&w, &bad);
    assert!(!passes(&w, &bad));
    assert!(
        text.contains("tokens (i32): 2 of 64 elements differ"),
        "{text}"
    );
}

/// gemm_tile accumulates into C and expert_rows into out: the reference
/// does too, and a run that overwrote instead fails.
#[test]
fn the_reference_accumulates_where_the_kernels_do() {
    let text = r#"
        [tensors]
        A = { shape = [32, 32], init = "random", seed = 5 }
        B = { shape = [32, 32], init = "random", seed = 6 }
        C = { shape = [32, 32], init = "random", seed = 7 }

        [[body]]
        call = "gemm_tile"
        args = ["A", "B", "C"]
    "#;
    let w = WorkloadFile::parse(text).unwrap().build(&[]).unwrap();
    let (good, _) = run(&w);
    assert!(passes(&w, &good), "{}", report(&w, &good));
    // The same table on C = 0: what an overwriting kernel leaves.
    let c = w.tensors.iter().find(|t| t.name == "C").unwrap().clone();
    let mut zeroed = w.arena.clone();
    zeroed.write_f32(&c, &vec![0.0; c.elements()]);
    Shim::default().run(&w.table, &mut zeroed.bytes).unwrap();
    let mut overwritten = good.clone();
    overwritten.write_f32(&c, &zeroed.read_f32(&c));
    assert!(!passes(&w, &overwritten));
}

/// The kernels the examples leave out (add, softmax), streams and events,
/// a sequential loop, the structured region form and integer expressions.
#[test]
fn streams_events_and_the_other_kernels() {
    let text = r#"
        [symbols]
        parts = { max = 4, default = 4 }

        [tensors]
        A = { shape = [64, 64], init = "random", seed = 11 }
        B = { shape = [64, 64], init = "random", seed = 12, scale = 4.0 }
        S = { shape = [64, 64] }
        P = { shape = [64, 64] }
        V = { shape = [8] }

        [[body]]
        stream = 1
        body = [
          { parallel = "i", dense_dyn = "parts", body = [
            { call = "add", args = [
              "A[i * 16, 0; 16 x 64]",
              { tensor = "B", at = ["i * 16", 0], rows = 16, cols = 64 },
              "S[(i * 48) / 3, 0 ; 16 x 64]",
            ] },
          ] },
          { record = 3, stream = 1 },
        ]

        [[body]]
        wait = 3
        stream = 2

        [[body]]
        sequential = "i"
        dense = 4
        body = [
          { call = "softmax", stream = 2, args = ["S[i * 16, 0; 16 x 64]", "P[i * 16, 0; 16 x 64]"] },
          { when = "i % 2 == 1", then = [{ let = "unused", value = "i" }] },
        ]
    "#;
    let w = WorkloadFile::parse(text).unwrap().build(&[]).unwrap();
    assert_eq!(w.tasks.len(), 8);
    assert_eq!(
        w.tasks.iter().map(|t| t.stream).collect::<Vec<_>>(),
        [1, 1, 1, 1, 2, 2, 2, 2]
    );
    let (arena, ran) = run(&w);
    assert_eq!(ran, 8);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
    let text = host_tools::inspect::inspect(&w.table, false);
    for want in ["record", "wait", "sequential", "call softmax"] {
        assert!(text.to_lowercase().contains(want), "{want} in:\n{text}");
    }
}

/// A minimal valid file, for the malformed variants below.
const BASE: &str = r#"[symbols]
n = { max = 4, default = 2 }

[tensors]
A = { shape = [64, 64], init = "random", seed = 1 }
B = { shape = [64, 64] }
L = { dtype = "i32", shape = [1, 4], values = [1, 2, 3, 4], input = true }

[[body]]
parallel = "i"
dense_dyn = "n"
body = [
  { call = "add", args = ["A[i * 16, 0; 16 x 64]", "A[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]"] },
]
"#;

fn refused(text: &str) -> FileError {
    match WorkloadFile::parse(text).and_then(|f| f.build(&[]).map(|_| ())) {
        Ok(()) => panic!("accepted:\n{text}"),
        Err(e) => e,
    }
}

#[test]
fn the_base_file_is_valid() {
    let w = WorkloadFile::parse(BASE).unwrap().build(&[]).unwrap();
    let (arena, _) = run(&w);
    assert!(passes(&w, &arena));
}

#[test]
fn malformed_files_say_what_and_where() {
    let body = |call: &str| {
        BASE.replace(r#"{ call = "add", args = ["A[i * 16, 0; 16 x 64]", "A[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]"] },"#, call)
    };
    // (file, kind, text in the message, line)
    let cases: Vec<(String, ErrorKind, &str, Option<usize>)> = vec![
        (
            BASE.replace("[tensors]", "[tensors"),
            ErrorKind::Syntax,
            "",
            Some(4),
        ),
        (
            BASE.replace("dense_dyn = \"n\"", "dense_dyn = \"n\"\nstep = 2"),
            ErrorKind::Syntax,
            "unknown field `step`",
            Some(12),
        ),
        (
            body(r#"{ call = "add", dense = 4, args = [] },"#),
            ErrorKind::Structure,
            "`dense` does not belong in a call entry",
            Some(13),
        ),
        (
            body(r#"{ call = "add", args = ["Q[0, 0; 8 x 8]", "A[0, 0; 8 x 8]", "B[0, 0; 8 x 8]"] },"#),
            ErrorKind::UnknownTensor,
            "unknown tensor `Q` (tensors: A, B, L)",
            Some(13),
        ),
        (
            body(r#"{ call = "matmul_f16", args = [] },"#),
            ErrorKind::UnknownKernel,
            "unknown kernel `matmul_f16` (kernels a workload file can call: add, gemm_tile, \
             rmsnorm, softmax, route_topk, expert_rows)",
            Some(13),
        ),
        (
            body(r#"{ call = "add", args = ["A[j * 16, 0; 16 x 64]", "A[0, 0; 16 x 64]", "B[0, 0; 16 x 64]"] },"#),
            ErrorKind::UnknownName,
            "unknown name `j` (in scope: i, n)",
            Some(13),
        ),
        (
            BASE.replace("dense_dyn = \"n\"", "dense_dyn = \"rows\""),
            ErrorKind::Symbol,
            "unknown symbol `rows` (symbols: n)",
            Some(11),
        ),
        (
            body(r#"{ call = "add", args = ["A[i * , 0; 16 x 64]", "A[0, 0; 16 x 64]", "B[0, 0; 16 x 64]"] },"#),
            ErrorKind::Expression,
            "\"A[i * , 0; 16 x 64]\", column 7 of the expression: expected a number, a name or `(`, found `, 0; 16`",
            Some(13),
        ),
        (
            body(r#"{ call = "add", args = ["A[0, 0; 16 x 64]", "B[0, 0; 16 x 64]"] },"#),
            ErrorKind::Call,
            "call add: 2 tensor arguments, the kernel takes 3 (a, b, c)",
            Some(13),
        ),
        (
            body(r#"{ call = "gemm_tile", args = ["A[0, 0; 32 x 32]", "A[0, 0; 16 x 32]", "B[0, 0; 32 x 32]"] },"#),
            ErrorKind::Shape,
            "call gemm_tile (a 32x32, b 16x32, c 32x32)",
            Some(13),
        ),
        (
            body(r#"{ call = "add", args = ["A[0, 0; 1 x 4]", "L", "B[0, 0; 1 x 4]"] },"#),
            ErrorKind::Shape,
            "argument 1 (b): the kernel takes f32, tensor `L` is i32",
            Some(13),
        ),
        (
            body(r#"{ call = "add", args = ["A[60, 0; 8 x 8]", "A[0, 0; 8 x 8]", "B[0, 0; 8 x 8]"] },"#),
            ErrorKind::Shape,
            "offset 60 + size 8 in dimension 0 is outside `A` (shape [64, 64])",
            Some(13),
        ),
        (
            body(r#"{ call = "add", args = ["A[i * 32, 0; 32 x 64]", "A[0, 0; 32 x 64]", "B[0, 0; 32 x 64]"] },"#)
                .replace("default = 2", "default = 3"),
            ErrorKind::Expand,
            "call add argument 0 (a): [64, 96) in dimension 0 is outside `A` (shape [64, 64]) (with i = 2)",
            Some(13),
        ),
        (
            body(r#"{ parallel = "k", ragged = { lengths = "L", at = [0, "i"], max = 1 }, body = [] },"#),
            ErrorKind::Expand,
            "loop count 2 outside [0, 1] (with i = 1)",
            Some(13),
        ),
        (
            body(r#"{ let = "m", value = "load(B, 0, 0)" },"#),
            ErrorKind::Shape,
            "load from `B`: only i32 tensors can be loaded",
            Some(13),
        ),
        (
            body(r#"{ when = "i % 2 == 1 && 1", then = [] },"#),
            ErrorKind::Expression,
            "column 12 of the expression: unexpected `&& 1` after the expression",
            Some(13),
        ),
        (
            body(r#"{ let = "m", value = "load(L, 0, i) + 8 / (2 - 2)" },"#),
            ErrorKind::Expression,
            "division by zero",
            Some(13),
        ),
        (
            BASE.replace("seed = 1 ", ""),
            ErrorKind::Tensor,
            "tensor `A`: init = \"random\" needs a seed",
            Some(5),
        ),
        (
            BASE.replace("values = [1, 2, 3, 4]", "values = [1, 2, 3]"),
            ErrorKind::Tensor,
            "tensor `L`: 3 values for 4 elements (shape [1, 4])",
            Some(7),
        ),
        (
            BASE.replace(", default = 2", ""),
            ErrorKind::Symbol,
            "symbol `n` has no default: give it a value (wsp: --symbol n=N)",
            None,
        ),
        (
            body(r#"{ let = "i", value = 3 },"#),
            ErrorKind::Structure,
            "`i` is already a loop variable here",
            Some(13),
        ),
        (
            body(r#"{ let = "m", call = "add", value = 3 },"#),
            ErrorKind::Structure,
            "a body entry is one thing, this one has let and call: split it",
            Some(13),
        ),
        (
            body(&(0..9).fold(String::new(), |inner, d| {
                format!(r#"{{ parallel = "v{d}", dense = 1, body = [{inner}] }}"#)
            })),
            ErrorKind::Lower,
            "loops nested deeper than 8",
            None,
        ),
        (
            body(r#"{ call = "rmsnorm", args = ["A[0, 0; 16 x 64]", "A[0, 0; 1 x 64]", "B[0, 0; 16 x 64]"], scalars = [-1.0] },"#),
            ErrorKind::Shape,
            "call rmsnorm",
            Some(13),
        ),
        (
            format!("x = {}1{}", "[".repeat(100), "]".repeat(100)),
            ErrorKind::Syntax,
            "nested deeper than 64",
            Some(1),
        ),
        // Expressions are parsed, resolved and dropped recursively: past
        // these limits a file overflowed the stack (an abort, not an error).
        // 65 parentheses around `i` (64 are fine, below).
        (
            body(&format!(
                r#"{{ call = "add", args = ["A[{}i{} * 16, 0; 16 x 64]", "A[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]"] }},"#,
                "(".repeat(65),
                ")".repeat(65)
            )),
            ErrorKind::Expression,
            "column 67 of the expression: expression nested more than 64 deep",
            Some(13),
        ),
        // `i + i + ...` with 256 additions: one too many with the `* 16`
        // after them.
        (
            body(&format!(
                r#"{{ call = "add", args = ["A[{}i * 16, 0; 16 x 64]", "A[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]"] }},"#,
                "i + ".repeat(256)
            )),
            ErrorKind::Expression,
            "expression too long: more than 256 operations",
            Some(13),
        ),
    ];
    for (text, kind, message, line) in cases {
        let e = refused(&text);
        assert_eq!(e.kind, kind, "{e}\nin:\n{text}");
        assert!(e.message.contains(message), "{e}\nwanted: {message}");
        assert_eq!(e.line, line, "{e}");
    }
    // At the limits: 64 parentheses, and 256 operations (253
    // additions, two products and a subtraction: 16 i).
    for region in [
        format!("{}i{} * 16", "(".repeat(64), ")".repeat(64)),
        format!("{}i * 16 - {} * i", "i + ".repeat(253), 253),
    ] {
        let text = body(&format!(
            r#"{{ call = "add", args = ["A[{region}, 0; 16 x 64]", "A[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]"] }},"#
        ));
        WorkloadFile::parse(&text)
            .and_then(|f| f.build(&[]))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The kernels docs/workload-files.md lists: the ones with an f64
/// reference. Every other registry kernel is refused where it is named,
/// with the list, rather than accepted and then failing the build (it used
/// to panic: "kernel square has no f64 reference").
#[test]
fn only_kernels_with_a_reference_can_be_called() {
    const DOCUMENTED: [&str; 6] = [
        "add",
        "gemm_tile",
        "rmsnorm",
        "softmax",
        "route_topk",
        "expert_rows",
    ];
    let list = "(kernels a workload file can call: add, gemm_tile, rmsnorm, softmax, \
                route_topk, expert_rows)";
    let text = |kernel: &str| {
        BASE.replace(
            r#"{ call = "add", args = ["A[i * 16, 0; 16 x 64]", "A[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]"] },"#,
            &format!(r#"{{ call = "{kernel}", args = [] }},"#),
        )
    };
    let mut others = 0;
    for k in wsp_ffi::all() {
        let e = refused(&text(k.name));
        if DOCUMENTED.contains(&k.name) {
            // Past the name: the arguments are wrong for it.
            assert_eq!(e.kind, ErrorKind::Call, "{}: {e}", k.name);
        } else {
            others += 1;
            assert_eq!(e.kind, ErrorKind::UnknownKernel, "{}: {e}", k.name);
            let want = format!(
                "kernel `{}` has no f64 reference to check a run against, so a workload file \
                 cannot call it {list}",
                k.name
            );
            assert_eq!(e.message, want);
            // The kernel's name, in `  { call = "NAME"`.
            assert_eq!((e.line, e.column), (Some(13), Some(12)), "{e}");
        }
    }
    assert!(others >= 1, "the registry has kernels without a reference");
    // The audit's file: `square` on whole tensors, line 9.
    let sq = r#"name = "sq"

[tensors]
x = { shape = [32, 32], init = "random", seed = 1 }
y = { shape = [32, 32] }

[[body]]
call = "square"
args = ["x", "y"]
"#;
    let e = refused(sq);
    assert_eq!(e.kind, ErrorKind::UnknownKernel);
    assert_eq!((e.line, e.column), (Some(8), Some(8)), "{e}");
    assert!(e.message.contains(list), "{e}");
}

/// A call whose written argument overlaps another of its arguments (which
/// the orchestrator refuses at run time) is refused by the file: at the
/// writer when the regions are constants, else by the reference expansion
/// with the loop indices. Arguments are named by their place in the call.
/// Overlapping reads, and writes next to (not over) a read, are fine.
#[test]
fn a_written_argument_may_not_overlap_another() {
    let call = |c: &str| {
        BASE.replace(
            r#"{ call = "add", args = ["A[i * 16, 0; 16 x 64]", "A[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]"] },"#,
            c,
        )
    };
    // add(A, B, A): argument 2 writes over argument 0, with B between.
    let e = refused(&call(
        r#"{ call = "add", args = ["A[0, 0; 16 x 64]", "B[0, 0; 16 x 64]", "A[8, 0; 16 x 64]"] },"#,
    ));
    assert_eq!(e.kind, ErrorKind::Call, "{e}");
    assert_eq!(
        e.message,
        "call add: argument 2 (c) writes a region of `A` overlapping argument 0 (a); a \
         kernel's output may not overlap its other arguments"
    );
    // At the written argument: `"A[8, ...` in the line.
    let line = "  { call = \"add\", args = [\"A[0, 0; 16 x 64]\", \"B[0, 0; 16 x 64]\", ";
    assert_eq!((e.line, e.column), (Some(13), Some(line.len() + 1)), "{e}");
    // gemm_tile(a, b, c) with c over b: c reads and writes, and is named first.
    let e = refused(&call(
        r#"{ call = "gemm_tile", args = ["A[0, 0; 32 x 32]", "B[0, 0; 32 x 32]", "B[0, 16; 32 x 32]"] },"#,
    ));
    assert_eq!(e.kind, ErrorKind::Call, "{e}");
    assert!(
        e.message.starts_with(
            "call gemm_tile: argument 2 (c) writes a region of `B` overlapping argument 1 (b);"
        ),
        "{e}"
    );
    // Known only when expanded: the regions meet at i = 1 only.
    let e = refused(&call(
        r#"{ call = "add", args = ["A[i * 16, 0; 16 x 64]", "B[0, 0; 16 x 64]", "A[16, 0; 16 x 64]"] },"#,
    ));
    assert_eq!(e.kind, ErrorKind::Expand, "{e}");
    assert_eq!(
        e.message,
        "call add: argument 2 (c) writes a region of `A` overlapping argument 0 (a); a \
         kernel's output may not overlap its other arguments (with i = 1)"
    );
    // At the call: its `{`, after the line's two spaces.
    assert_eq!((e.line, e.column), (Some(13), Some(3)), "{e}");
    // In a process, the reference follows the device's expander.
    let process = r#"[tensors]
A = { shape = [64, 64], init = "random", seed = 1 }
B = { shape = [64, 64] }

[[body]]
process = "p"
body = [
  { parallel = "i", dense = 2, body = [
    { call = "add", args = ["A[i * 16, 0; 16 x 64]", "B[0, 0; 16 x 64]", "A[16, 0; 16 x 64]"] },
  ] },
]
"#;
    let e = refused(process);
    assert_eq!(e.kind, ErrorKind::Expand, "{e}");
    assert!(
        e.message
            .contains("call add: argument 2 (c) writes a region of `A` overlapping argument 0 (a)"),
        "{e}"
    );
    // A write beside a read of the same tensor runs and passes.
    let w = WorkloadFile::parse(&call(
        r#"{ call = "add", args = ["A[0, 0; 16 x 64]", "A[0, 0; 16 x 64]", "A[16, 0; 16 x 64]"] },"#,
    ))
    .unwrap()
    .build(&[])
    .unwrap();
    let (arena, ran) = run(&w);
    assert_eq!(ran, 2);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
}

#[test]
fn a_load_of_data_nobody_writes_needs_input() {
    let text = BASE.replace(", input = true", "").replace(
        r#"{ call = "add", args"#,
        r#"{ let = "m", value = "load(L, 0, i)" },
  { call = "add", args"#,
    );
    let e = refused(&text);
    assert_eq!(e.kind, ErrorKind::Tensor);
    assert!(
        e.message.contains("reads `L`, which no call writes: if the host provides it, mark it `input = true` (line 7)"),
        "{e}"
    );
    assert_eq!((e.line, e.column), (Some(13), Some(30)), "{e}");
}

/// Cut or damaged files give errors, never panics.
#[test]
fn damaged_files_never_panic() {
    let mut texts = vec![BASE.to_string()];
    for path in examples() {
        texts.push(std::fs::read_to_string(path).unwrap());
    }
    let mut refused = 0;
    for text in &texts {
        let lines: Vec<&str> = text.lines().collect();
        let mut variants = Vec::new();
        for cut in 0..lines.len() {
            variants.push(lines[..cut].join("\n"));
            let mut without = lines.clone();
            without.remove(cut);
            variants.push(without.join("\n"));
        }
        for (at, c) in text.char_indices().filter(|(_, c)| c.is_ascii_digit()) {
            let mut damaged = text.clone();
            damaged.replace_range(at..at + c.len_utf8(), if c == '0' { "7" } else { "0" });
            variants.push(damaged);
        }
        for v in variants {
            if WorkloadFile::parse(&v).and_then(|f| f.build(&[])).is_err() {
                refused += 1;
            }
        }
    }
    assert!(refused > 50, "{refused}");
}

/// Routing decisions the f32 router could take either way are noted: all
/// logits equal (x = 0) ties every pick. The device breaks the exact ties
/// as the reference does (lowest expert), so the run still passes.
#[test]
fn routing_near_ties_are_noted() {
    let text = std::fs::read_to_string(
        examples()
            .into_iter()
            .find(|p| p.file_stem().unwrap() == "moe")
            .unwrap(),
    )
    .unwrap()
    .replace(
        r#"x = { shape = [32, 64], init = "random", seed = 0x9E3779BA }"#,
        r#"x = { shape = [32, 64] }"#,
    );
    let w = WorkloadFile::parse(&text).unwrap().build(&[]).unwrap();
    assert_eq!(w.notes.len(), 1, "{:?}", w.notes);
    assert!(
        w.notes[0].contains("64 routing decisions are within the f32 router's error of a tie"),
        "{}",
        w.notes[0]
    );
    let (arena, _) = run(&w);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
}

/// A schedule in a file: a `dispatch` block gives its calls their own
/// policy and key (a taskset), `[schedule] window` bounds the tasks in
/// flight; both reach the device, and mistakes are refused.
#[test]
fn a_file_carries_its_schedule() {
    use device_runtime::abi::Table;
    use device_runtime::orch::StallReason;
    use device_runtime::sched::{DispatchKey, PolicyKind, SchedConfig};
    use host_tools::semantic::run_semantic_with;
    use wsp_ffi::CoreKind;
    let text = r#"[schedule]
window = 3

[tensors]
A = { shape = [64, 64], init = "random", seed = 1 }
B = { shape = [64, 64] }
C = { shape = [64, 64] }

[[body]]
dispatch = "affinity"
key = "loop:0"
body = [
  { parallel = "i", dense = 4, body = [
    { call = "add", args = ["A[i * 16, 0; 16 x 64]", "A[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]"] },
  ] },
]

[[body]]
parallel = "i"
dense = 4
body = [
  { call = "add", args = ["B[i * 16, 0; 16 x 64]", "B[i * 16, 0; 16 x 64]", "C[i * 16, 0; 16 x 64]"] },
]
"#;
    let w = WorkloadFile::parse(text).unwrap().build(&[]).unwrap();
    let table = Table::parse(&w.table).unwrap();
    let info = table.program_info();
    assert_eq!(info.window, 3);
    assert_eq!(info.tasksets_defined, 0b11);
    let sets: Vec<u8> = w.tasks.iter().map(|t| t.taskset).collect();
    assert_eq!(sets, [1, 1, 1, 1, 0, 0, 0, 0]);
    let sched = SchedConfig {
        threads: 2,
        policy: PolicyKind::RoundRobin,
        key: DispatchKey::TaskIndex,
        ..SchedConfig::default()
    };
    let mut arena = w.arena.clone();
    let run = run_semantic_with(
        &w.table,
        &mut arena.bytes,
        &[CoreKind::Vector; 2],
        &sched,
        &RunOptions::default(),
    )
    .unwrap();
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
    let set1 = run.stats.tasksets[1].unwrap();
    assert_eq!((set1.decision, set1.placed), ("affinity", 4));
    assert_eq!(set1.key, Some(DispatchKey::Loop(0)));
    assert_eq!(run.stats.tasksets[0].unwrap().placed, 4);
    let ring = run.stats.stalls.resources[StallReason::TaskRingFull as usize];
    assert_eq!((ring.capacity, ring.high_water), (3, 3));

    let window = format!("task window 0; 1 to {}", device_runtime::abi::TASK_WINDOW);
    for (from, to, message) in [
        ("window = 3", "window = 0", window.as_str()),
        (
            "\"affinity\"",
            "\"gang\"",
            "dispatch policy `gang`; policies are",
        ),
        (
            "\"loop:0\"",
            "\"loop:x\"",
            "dispatch key `loop:x`: expected task",
        ),
        (
            "key = \"loop:0\"",
            "stream = 2",
            "`stream` does not belong in a dispatch",
        ),
    ] {
        let e = refused(&text.replace(from, to));
        assert!(e.to_string().contains(message), "{e} (wanted {message})");
        assert!(e.line.is_some(), "{e}");
    }
    // A key with a policy that places without one is refused at the key
    // (line 11), as `wsp run --key` is: it used to be dropped silently.
    for policy in ["round-robin", "shared"] {
        let e = refused(&text.replace("\"affinity\"", &format!("\"{policy}\"")));
        assert_eq!(
            (e.kind, e.line, e.column),
            (ErrorKind::Structure, Some(11), Some(7)),
            "{e}"
        );
        let says = format!(
            "dispatch key `loop:0`: a key applies to the key-based policies (affinity, hash, \
             work-stealing, adaptive); {policy} places tasks without one"
        );
        assert!(e.message.contains(&says), "{e} (wanted {says})");
    }
    // Without the key, they are accepted.
    let w = WorkloadFile::parse(
        &text
            .replace("\"affinity\"", "\"round-robin\"")
            .replace("key = \"loop:0\"\n", ""),
    )
    .unwrap()
    .build(&[])
    .unwrap();
    assert_eq!(w.tasks.len(), 8);
}

/// A scratch tensor written in part, then read whole: T's row 0 only.
const PART: &str = r#"[schedule]
heap = 256

[tensors]
A = { shape = [8, 8], init = "random", seed = 1 }
T = { shape = [8, 8], scratch = true }
D = { shape = [8, 8] }

[[body]]
call = "add"
args = ["A[0, 0; 1 x 8]", "A[0, 0; 1 x 8]", "T[0, 0; 1 x 8]"]

[[body]]
call = "add"
args = ["T", "A", "D"]
"#;

/// The f32 data of tensor `name` after a run.
fn tensor(w: &FileWorkload, arena: &Arena, name: &str) -> Vec<f32> {
    let l = w.tensors.iter().find(|l| l.name == name).unwrap();
    arena.read_f32(l)
}

/// A read of a scratch element no task wrote since the tensor's scope
/// began is refused, naming the tensor, the element and the call's line:
/// the heap holds whatever it held, not zeros.
#[test]
fn a_read_of_unwritten_scratch_elements_is_refused() {
    // Row 0 written, the whole tensor read by the call at line 13: the
    // first element missing is row 1's first.
    let e = refused(PART);
    assert_eq!(e.kind, ErrorKind::Expand, "{e}");
    assert_eq!((e.line, e.column), (Some(13), Some(1)), "{e}");
    assert!(
        e.message.contains(
            "call add argument 0 (a) reads element [1, 0] of scratch tensor `T`, \
             which no task has written since its scope began"
        ),
        "{e}"
    );
    // The left half written: the first missing element is [0, 4].
    let e = refused(
        &PART
            .replace("\"T[0, 0; 1 x 8]\"", "\"T[0, 0; 8 x 4]\"")
            .replace(
                "\"A[0, 0; 1 x 8]\", \"A[0, 0; 1 x 8]\"",
                "\"A[0, 0; 8 x 4]\", \"A[0, 0; 8 x 4]\"",
            ),
    );
    assert!(
        e.message
            .contains("reads element [0, 4] of scratch tensor `T`"),
        "{e}"
    );
    // gemm_tile accumulates into its output, so it reads it: a scratch
    // output no task wrote is refused too.
    let gemm = PART
        .replace("\"T[0, 0; 1 x 8]\"", "\"D[0, 0; 1 x 8]\"")
        .replace(
            "call = \"add\"\nargs = [\"T\", \"A\", \"D\"]",
            "call = \"gemm_tile\"\nargs = [\"A\", \"A\", \"T\"]",
        );
    let e = refused(&gemm);
    assert_eq!(e.line, Some(13), "{e}");
    assert!(
        e.message
            .contains("call gemm_tile argument 2 (c) reads element [0, 0] of scratch tensor `T`"),
        "{e}"
    );
    // Each row written by a loop, then the whole read: valid, and the run
    // passes with D = (A + A) + A.
    let whole = PART.replace(
        "call = \"add\"\nargs = [\"A[0, 0; 1 x 8]\", \"A[0, 0; 1 x 8]\", \"T[0, 0; 1 x 8]\"]",
        "parallel = \"i\"\ndense = 8\nbody = [\n  { call = \"add\", args = [\"A[i, 0; 1 x 8]\", \"A[i, 0; 1 x 8]\", \"T[i, 0; 1 x 8]\"] },\n]",
    );
    let w = WorkloadFile::parse(&whole).unwrap().build(&[]).unwrap();
    let (arena, ran) = run(&w);
    assert_eq!(ran, 9);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
    let a = tensor(&w, &w.arena, "A");
    let d = tensor(&w, &arena, "D");
    for (x, y) in a.iter().zip(&d) {
        assert_eq!(*y, (x + x) + x);
    }
}

/// `free` ends a scratch tensor's scope: what was written before it is
/// gone, in a plain program and in a process (the table walk).
#[test]
fn a_free_forgets_what_a_scratch_tensor_held() {
    let plain = r#"[schedule]
heap = 256

[tensors]
A = { shape = [8, 8], init = "random", seed = 1 }
T = { shape = [8, 8], scratch = true }
D = { shape = [8, 8] }
E = { shape = [8, 8] }

[[body]]
call = "add"
args = ["A", "A", "T"]

[[body]]
call = "add"
args = ["T", "A", "D"]

[[body]]
free = "T"

[[body]]
call = "add"
args = ["A", "A", "T"]

[[body]]
call = "add"
args = ["T", "D", "E"]
"#;
    // Valid: E = (A + A) + ((A + A) + A).
    let w = WorkloadFile::parse(plain).unwrap().build(&[]).unwrap();
    let (arena, _) = run(&w);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
    let a = tensor(&w, &w.arena, "A");
    let e = tensor(&w, &arena, "E");
    for (x, y) in a.iter().zip(&e) {
        assert_eq!(*y, (x + x) + ((x + x) + x));
    }
    // After the free only row 0 is written again: the read at line 25
    // is refused.
    let e = refused(&plain.replacen(
        "args = [\"A\", \"A\", \"T\"]\n\n[[body]]\ncall = \"add\"\nargs = [\"T\", \"D\", \"E\"]",
        "args = [\"A[0, 0; 1 x 8]\", \"A[0, 0; 1 x 8]\", \"T[0, 0; 1 x 8]\"]\n\n[[body]]\ncall = \"add\"\nargs = [\"T\", \"D\", \"E\"]",
        1,
    ));
    assert_eq!(e.line, Some(25), "{e}");
    assert!(
        e.message
            .contains("reads element [1, 0] of scratch tensor `T`"),
        "{e}"
    );

    // The same in a process: the reference follows the table.
    let process = r#"[schedule]
heap = 256

[tensors]
A = { shape = [8, 8], init = "random", seed = 1 }
T = { shape = [8, 8], scratch = true }
D = { shape = [8, 8] }
E = { shape = [8, 8] }

[[body]]
process = "p"
body = [
  { call = "add", args = ["A", "A", "T"] },
  { call = "add", args = ["T", "A", "D"] },
  { free = "T" },
  { call = "add", args = ["A", "A", "T"] },
  { call = "add", args = ["T", "D", "E"] },
]
"#;
    let w = WorkloadFile::parse(process).unwrap().build(&[]).unwrap();
    let (arena, ran) = run(&w);
    assert_eq!(ran, 4);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
    let e = tensor(&w, &arena, "E");
    for (x, y) in a.iter().zip(&e) {
        assert_eq!(*y, (x + x) + ((x + x) + x));
    }
    let e = refused(&process.replace(
        "{ free = \"T\" },\n  { call = \"add\", args = [\"A\", \"A\", \"T\"] },",
        "{ free = \"T\" },\n  { call = \"add\", args = [\"A[0, 0; 1 x 8]\", \"A[0, 0; 1 x 8]\", \"T[0, 0; 1 x 8]\"] },",
    ));
    assert!(
        e.message
            .contains("reads element [1, 0] of scratch tensor `T`"),
        "{e}"
    );
}

/// Offsets near i64::MAX are out of range, not an overflow: the resolver
/// checks constant offsets, the reference those it computes.
#[test]
fn offsets_past_i64_are_out_of_range() {
    let file = |args: &str| {
        format!(
            r#"[tensors]
A = {{ shape = [4, 4], init = "random", seed = 1 }}
B = {{ shape = [4, 4], init = "random", seed = 2 }}
C = {{ shape = [4, 4] }}

[[body]]
parallel = "i"
dense = 2
body = [{{ call = "add", args = [{args}, "B[0, 0; 1 x 4]", "C[0, 0; 1 x 4]"] }}]
"#
        )
    };
    let max = i64::MAX;
    for (arg, kind, says) in [
        (
            format!("\"A[{max}, 0; 1 x 4]\""),
            ErrorKind::Shape,
            format!("offset {max} + size 1 in dimension 0 is outside `A` (shape [4, 4])"),
        ),
        (
            format!("{{ tensor = \"A\", at = [0, {max}], rows = 1, cols = 4 }}"),
            ErrorKind::Shape,
            format!("offset {max} + size 4 in dimension 1 is outside `A` (shape [4, 4])"),
        ),
        (
            format!("\"A[i * {max}, 0; 1 x 4]\""),
            ErrorKind::Expand,
            format!(
                "call add argument 0 (a): [{max}, {max} + 1) in dimension 0 is outside `A` \
                 (shape [4, 4]) (with i = 1)"
            ),
        ),
    ] {
        let e = refused(&file(&arg));
        assert_eq!(e.kind, kind, "{e}");
        assert_eq!(e.line, Some(9), "{e}");
        assert!(e.message.contains(&says), "{e} (wanted {says})");
    }
}

/// `skip = N` starts a random tensor's data N draws into its seed's
/// stream: the values equal those N on in a tensor drawn from the start
/// (one draw per element), and the documented limit, 2^32, takes no time.
#[test]
fn a_skip_starts_the_data_further_on() {
    let text = r#"[tensors]
A = { shape = [1, 16], init = "random", seed = 7, scale = 2.0 }
B = { shape = [1, 4], init = "random", seed = 7, scale = 2.0, skip = 5 }
C = { shape = [1, 4] }
I = { dtype = "i32", shape = [1, 16], init = "random", seed = 7, range = [-3, 9] }
J = { dtype = "i32", shape = [1, 4], init = "random", seed = 7, range = [-3, 9], skip = 11 }
K = { shape = [1, 4], init = "random", seed = 7, skip = 4294967296 }

[[body]]
call = "add"
args = ["A[0, 0; 1 x 4]", "B", "C"]
"#;
    let started = std::time::Instant::now();
    let w = WorkloadFile::parse(text).unwrap().build(&[]).unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let layout = |name: &str| w.tensors.iter().find(|l| l.name == name).unwrap();
    let (a, b) = (w.arena.read_f32(layout("A")), w.arena.read_f32(layout("B")));
    assert_eq!(b, a[5..9]);
    let (i, j) = (w.arena.read_i32(layout("I")), w.arena.read_i32(layout("J")));
    assert_eq!(j, i[11..15]);
    let e = refused(&text.replace("4294967296", "4294967297"));
    assert!(
        e.message.contains("skip 4294967297 is more than 2^32"),
        "{e}"
    );
}

/// A file whose calls are all skipped at run time builds (other symbols
/// may run it), but its check fails: a run of no task would pass
/// whatever the runtime did.
#[test]
fn a_run_of_no_task_does_not_pass() {
    let text = r#"[symbols]
n = { max = 4, default = 0 }

[tensors]
A = { shape = [4, 4], init = "random", seed = 1 }
C = { shape = [4, 4] }

[[body]]
parallel = "i"
dense_dyn = "n"
body = [
  { call = "add", args = ["A[i, 0; 1 x 4]", "A[i, 0; 1 x 4]", "C[i, 0; 1 x 4]"] },
]
"#;
    let when = text
        .replace(
            "parallel = \"i\"\ndense_dyn = \"n\"\nbody",
            "when = \"0\"\nthen",
        )
        .replace(
            "\"A[i, 0; 1 x 4]\", \"A[i, 0; 1 x 4]\", \"C[i, 0; 1 x 4]\"",
            "\"A\", \"A\", \"C\"",
        );
    let dense = text.replace("dense_dyn = \"n\"", "dense = 0");
    // n = 0 by default: no iteration; a `when` of 0; a dense loop of 0.
    for file in [text.to_string(), when, dense] {
        let w = WorkloadFile::parse(&file).unwrap().build(&[]).unwrap();
        assert!(w.tasks.is_empty());
        let (arena, ran) = run(&w);
        assert_eq!(ran, 0);
        let checks = w.check(&arena);
        assert!(!passes(&w, &arena), "{file}: {}", report(&w, &arena));
        assert_eq!(
            checks[0].output,
            "nothing ran: the program with n = 0 skips every call (a `when` of 0, a loop of 0 \
             iterations), so its reference has no task, and a run of no task would pass \
             whatever the runtime did"
        );
        assert!(!checks[0].passed());
    }
    // With n = 2 two tasks run, and the run passes.
    let w = WorkloadFile::parse(text)
        .unwrap()
        .build(&[("n".to_string(), 2)])
        .unwrap();
    let (arena, ran) = run(&w);
    assert_eq!(ran, 2);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
}

/// `[schedule] heap` is the scratch tensors' ring: in a file without one
/// it would only take arena bytes, so it is refused at its line.
#[test]
fn a_heap_without_scratch_tensors_is_refused() {
    let e = refused(&PART.replace(
        "T = { shape = [8, 8], scratch = true }",
        "T = { shape = [8, 8] }",
    ));
    assert_eq!(
        (e.kind, e.line, e.column),
        (ErrorKind::Structure, Some(2), Some(8)),
        "{e}"
    );
    assert!(
        e.message
            .contains("heap of 256 bytes, but no scratch tensor uses the heap"),
        "{e}"
    );
}

/// A scratch tensor's storage comes from the heap ring: a file that
/// declares one and gives no `[schedule] heap` is refused when it is
/// read, at the tensor, naming it and its size (8 x 8 f32: 256 bytes). It
/// used to pass the reading and fail only when lowered, with no place in
/// the file and in the Rust API's words (`call heap(bytes)`).
#[test]
fn a_scratch_tensor_without_a_heap_is_refused() {
    let text = PART.replace("[schedule]\nheap = 256\n", "");
    assert!(text.starts_with("\n[tensors]\nA = "), "{text}");
    let e = match WorkloadFile::parse(&text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e,
    };
    // Line 4 is `T = { shape = [8, 8], scratch = true }`: its table at column 5.
    assert_eq!(
        (e.kind, e.line, e.column),
        (ErrorKind::Tensor, Some(4), Some(5)),
        "{e}"
    );
    assert!(
        e.message.contains(
            "tensor `T` is a scratch tensor (256 bytes), whose storage comes from the heap \
             ring, but the file gives no heap: add `heap = BYTES` (a multiple of 64) under \
             [schedule]"
        ),
        "{e}"
    );
}

/// A `dense_dyn` loop's `max` is at most its symbol's: a larger one let
/// the table take values the file refuses (`--symbols 9`) and fail
/// midway. It is refused at the `max`, in a loop and in a process.
#[test]
fn a_loop_max_above_its_symbols_is_refused() {
    let text = r#"[symbols]
n = { max = 4, default = 4 }
[tensors]
A = { shape = [4, 4], init = "random", seed = 1 }
C = { shape = [4, 4] }

[[body]]
parallel = "t"
dense_dyn = "n"
max = 9
body = [ { call = "add", args = ["A[t, 0; 1 x 4]", "A[t, 0; 1 x 4]", "C[t, 0; 1 x 4]"] } ]
"#;
    let says = "`max = 9` of a loop over symbol `n`, whose max is 4: a loop's max is at most \
                its symbol's";
    let e = refused(text);
    assert_eq!(
        (e.kind, e.line, e.column),
        (ErrorKind::Symbol, Some(10), Some(7)),
        "{e}"
    );
    assert!(e.message.contains(says), "{e}");
    let e = refused(&text.replace("parallel = \"t\"", "process = \"p\"\nreplica = \"t\""));
    assert_eq!((e.kind, e.line), (ErrorKind::Symbol, Some(11)), "{e}");
    assert!(e.message.contains(says), "{e}");
    // A max of the symbol's or below is accepted.
    for max in [4, 2] {
        let w = WorkloadFile::parse(&text.replace("max = 9", &format!("max = {max}")))
            .unwrap()
            .build(&[("n".to_string(), 2)])
            .unwrap();
        assert_eq!(w.tasks.len(), 2);
    }
}

/// A process starts when the program reaches its entry: placed after a
/// program loop that sends more tokens than its channel holds, its
/// consumer never starts. The file is refused as a deadlock, with a hint
/// to put the process first; with the process first it runs and passes.
#[test]
fn a_process_after_the_loop_that_feeds_it_is_refused_with_a_hint() {
    let process = r#"
[[body]]
process = "c"
body = [
  { consume = "ch", as = "i", body = [
    { call = "add", args = ["y[i * 4, 0; 4 x 4]", "y[i * 4, 0; 4 x 4]", "z[i * 4, 0; 4 x 4]"] },
  ] },
]
"#;
    let feeder = r#"
[[body]]
parallel = "i"
dense = 4
body = [
  { call = "add", args = ["x[i * 4, 0; 4 x 4]", "zero", "y[i * 4, 0; 4 x 4]"] },
  { send = "ch", value = "i" },
]
"#;
    let head = r#"[channels]
ch = { depth = 2 }

[tensors]
x = { shape = [16, 4], init = "random", seed = 1 }
zero = { shape = [4, 4] }
y = { shape = [16, 4] }
z = { shape = [16, 4] }
"#;
    let e = refused(&format!("{head}{feeder}{process}"));
    assert!(e.message.contains("the reference cannot finish"), "{e}");
    assert!(
        e.message.contains(
            "hint: a process starts when the program reaches its entry, and process `c` comes \
             after an entry of the program that sends on or consumes from a channel"
        ),
        "{e}"
    );
    let w = WorkloadFile::parse(&format!("{head}{process}{feeder}"))
        .unwrap()
        .build(&[])
        .unwrap();
    let (arena, ran) = run(&w);
    assert_eq!(ran, 8);
    assert!(passes(&w, &arena), "{}", report(&w, &arena));
    // z = y + y = (x + 0) + (x + 0).
    let x = tensor(&w, &w.arena, "x");
    let z = tensor(&w, &arena, "z");
    for (a, b) in x.iter().zip(&z) {
        assert_eq!(*b, a + a);
    }
}

/// The late-process hint looks at where a top-level entry sends or
/// consumes, however deep: here the feeding loop is inside a stream
/// inside a branch. (Processes are top-level only, so the top-level order
/// is the order in which they start.)
#[test]
fn the_late_process_hint_sees_a_send_nested_in_a_branch_and_a_stream() {
    let text = r#"[channels]
ch = { depth = 2 }

[tensors]
x = { shape = [16, 4], init = "random", seed = 1 }
zero = { shape = [4, 4] }
y = { shape = [16, 4] }
z = { shape = [16, 4] }

[[body]]
when = "1"
then = [
  { stream = 1, body = [
    { sequential = "i", dense = 4, body = [
      { call = "add", args = ["x[i * 4, 0; 4 x 4]", "zero", "y[i * 4, 0; 4 x 4]"] },
      { send = "ch", value = "i" },
    ] },
  ] },
]

[[body]]
process = "c"
body = [
  { consume = "ch", as = "i", body = [
    { call = "add", args = ["y[i * 4, 0; 4 x 4]", "y[i * 4, 0; 4 x 4]", "z[i * 4, 0; 4 x 4]"] },
  ] },
]
"#;
    let e = refused(text);
    assert!(e.message.contains("the reference cannot finish"), "{e}");
    assert!(
        e.message
            .contains("hint: a process starts when the program reaches its entry, and process `c`"),
        "{e}"
    );
}
