//! Channels and processes in workload files: the example pipeline runs
//! and passes its f64 check, lowers to the same program as the built-in
//! `pipeline` workload, and every mistake is an error naming its line and
//! what is wrong.

use std::path::Path;

use host_tools::inspect::inspect_named;
use host_tools::shim::Shim;
use host_tools::workload_file::{ErrorKind, FileError, WorkloadFile};

fn example() -> WorkloadFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workloads/pipeline.toml");
    WorkloadFile::load(&path).unwrap()
}

#[test]
fn the_pipeline_file_runs_and_passes_its_check() {
    let w = example().build(&[]).unwrap();
    assert_eq!(w.tasks.len(), 24);
    let mut arena = w.arena.clone();
    let stats = Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    assert_eq!(stats.tasks, 24);
    let checks = w.check(&arena);
    assert!(checks.iter().all(|c| c.passed()), "{checks:?}");
    // The file is the built-in workload, written in TOML.
    let builtin =
        host_tools::pipeline::pipeline(host_tools::workloads::Params::of("pipeline").unwrap(), 2)
            .unwrap()
            .0;
    assert_eq!(w.table, builtin.table);
    // The check is not vacuous: a zeroed output tile fails it.
    let out = w.tensors.iter().find(|t| t.name == "out").unwrap();
    let at = out.arena_offset as usize + 4 * 64 * 64 * 3;
    arena.bytes[at..at + 4].copy_from_slice(&0f32.to_le_bytes());
    assert!(!w.check(&arena).iter().all(|c| c.passed()));
    // inspect names the file's channels and processes.
    let text = inspect_named(&w.table, false, &[], &w.program().csp_names());
    assert!(
        text.contains("declare channel 1 (to_store): capacity 2"),
        "{text}"
    );
    assert!(text.contains("process storer {"), "{text}");
}

const BASE: &str = r#"
[channels]
c = { depth = 1 }

[tensors]
A = { shape = [64, 64], init = "random", seed = 1 }
B = { shape = [64, 64] }

[[body]]
process = "p"
body = [
  { call = "add", label = "first", args = ["A", "A", "B"] },
  { send = "c", value = 0, after = "first" },
]

[[body]]
process = "q"
body = [
  { consume = "c", as = "t", body = [
    { call = "add", args = ["B", "B", "A"] },
  ] },
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
    assert_eq!(w.tasks.len(), 2);
    // `after` may be left out: the send stands for the call before it.
    let w = WorkloadFile::parse(&BASE.replace(", after = \"first\"", ""))
        .unwrap()
        .build(&[])
        .unwrap();
    assert_eq!(w.tasks.len(), 2);
}

#[test]
fn mistakes_in_channels_and_processes_say_what_and_where() {
    // (file, kind, text in the message, line)
    let cases: Vec<(String, ErrorKind, &str, usize)> = vec![
        (
            BASE.replace("c = { depth = 1 }", "c = { depth = 17 }"),
            ErrorKind::Channel,
            "channel `c`: depth 17; a channel holds 0 to 16 tokens",
            3,
        ),
        (
            BASE.replace("c = { depth = 1 }", "c = { depth = 1, latency = 16777216 }"),
            ErrorKind::Channel,
            "channel `c`: latency 16777216; at most 16777215 ticks",
            3,
        ),
        (
            BASE.replace("c = { depth = 1 }", "c = { depth = 1, size = 2 }"),
            ErrorKind::Syntax,
            "unknown field `size`",
            3,
        ),
        (
            BASE.replace("c = { depth = 1 }", "c = { depth = 1 }\nidle = {}"),
            ErrorKind::Channel,
            "channel `idle`: nothing sends on it",
            4,
        ),
        (
            BASE.replace(r#"{ send = "c","#, r#"{ send = "d","#),
            ErrorKind::Channel,
            "unknown channel `d` (channels: c)",
            13,
        ),
        (
            BASE.replace(r#"{ consume = "c","#, r#"{ consume = "e","#),
            ErrorKind::Channel,
            "unknown channel `e` (channels: c)",
            19,
        ),
        (
            BASE.replace(r#"after = "first""#, r#"after = "second""#),
            ErrorKind::Channel,
            "send on `c`: `after = \"second\"` is not the last call before this send (that is `first`)",
            13,
        ),
        (
            BASE.replace(
                r#"{ call = "add", label = "first", args = ["A", "A", "B"] },"#,
                "",
            ),
            ErrorKind::Channel,
            "send on `c`: the token stands for the last call before the send, and this process made none",
            13,
        ),
        (
            BASE.replace(r#"{ send = "c", value = 0, after = "first" },"#, r#"{ send = "c", after = "first" },"#),
            ErrorKind::Structure,
            "a send entry needs `value`",
            13,
        ),
        (
            BASE.replace(r#"{ send = "c", value = 0, after = "first" },"#, r#"{ send = "c", value = 0, as = "x" },"#),
            ErrorKind::Structure,
            "`as` does not belong in a send entry (it takes: value, after)",
            13,
        ),
        (
            BASE.replace(
                r#"{ call = "add", args = ["B", "B", "A"] },"#,
                r#"{ process = "inner", body = [] },"#,
            ),
            ErrorKind::Channel,
            "process `inner` is inside a loop, branch, dispatch or process",
            20,
        ),
        (
            BASE.replace(r#"process = "q""#, "process = \"q\"\ndense = 17"),
            ErrorKind::Channel,
            "process `q`: 17 replicas at most; a process has 1 to 16",
            16,
        ),
        (
            BASE.replace(r#"process = "q""#, "process = \"q\"\nreplica = \"r\""),
            ErrorKind::Structure,
            "`replica` names the index of a replicated process",
            18,
        ),
        (
            BASE.replace(r#"as = "t""#, r#"as = "A1 x""#),
            ErrorKind::Structure,
            "`A1 x` cannot name a token value",
            19,
        ),
    ];
    for (text, kind, message, line) in cases {
        let e = refused(&text);
        assert_eq!(e.kind, kind, "{e}\n{text}");
        assert!(e.message.contains(message), "{e} (wanted {message})");
        assert_eq!(e.line, Some(line), "{e}\n{text}");
    }
}

#[test]
fn a_replicated_process_binds_its_index() {
    let text = BASE
        .replace(
            r#"process = "p""#,
            "process = \"p\"\nreplica = \"r\"\ndense = 2",
        )
        .replace("value = 0", "value = \"r\"");
    let w = WorkloadFile::parse(&text).unwrap().build(&[]).unwrap();
    // Two producers, one token each; one consumer, one task per token.
    assert_eq!(w.tasks.len(), 4);
    let mut arena = w.arena.clone();
    let stats = Shim::default().run(&w.table, &mut arena.bytes).unwrap();
    assert_eq!(stats.tasks, 4);
}

#[test]
fn a_file_that_deadlocks_is_refused_with_the_named_report() {
    // The producer's replicas are bound to 0: nothing ever sends.
    let text = BASE
        .replace(
            "[channels]",
            "[symbols]\nn = { max = 2, default = 0 }\n\n[channels]",
        )
        .replace(r#"process = "p""#, "process = \"p\"\ndense_dyn = \"n\"");
    let e = refused(&text);
    assert_eq!(e.kind, ErrorKind::Expand, "{e}");
    for want in [
        "channel deadlock",
        "CONSUME waits for a token on channel 0",
        "no live process sends on channel 0",
        "is `q`, channel 0 is `c`",
    ] {
        assert!(e.message.contains(want), "no `{want}` in {e}");
    }
    // With a replica, it runs.
    let w = WorkloadFile::parse(&text)
        .unwrap()
        .build(&[("n".into(), 1)])
        .unwrap();
    assert_eq!(w.tasks.len(), 2);
}
