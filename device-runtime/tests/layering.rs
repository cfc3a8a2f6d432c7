//! The crate's module graph stays acyclic, with `abi` at the bottom:
//!
//! ```text
//! abi <- orch <- expand <- sched <- exec
//! ```
//!
//! (`sync`, `mailbox`, `platform`, `ascend` and `steal_deque` sit beside this chain,
//! below `sched`.) A module may name only modules below it. This test reads
//! the sources and fails on code (not comments) that names a module above.

use std::path::{Path, PathBuf};

/// Each module, with the crate modules its code must not name.
const RULES: &[(&str, &[&str])] = &[
    (
        "abi",
        &[
            "exec",
            "sched",
            "expand",
            "orch",
            "platform",
            "mailbox",
            "steal_deque",
        ],
    ),
    ("orch", &["exec", "sched", "expand", "platform", "mailbox"]),
    ("expand", &["exec", "sched", "platform", "mailbox"]),
    ("sched", &["exec"]),
    ("platform", &["exec", "sched", "expand", "orch"]),
    ("mailbox", &["exec", "sched", "expand", "orch", "platform"]),
    ("steal_deque", &["exec", "sched", "expand", "orch"]),
    ("ascend", &["exec", "sched", "expand", "orch"]),
];

/// The source files of module `name`: `src/name.rs`, or every file under `src/name/`.
fn sources(name: &str) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let file = src.join(format!("{name}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let mut files = Vec::new();
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    assert!(!files.is_empty(), "module {name} has no sources");
    files
}

/// Whether `at` in `code` starts an identifier-like token (no identifier
/// character before it).
fn starts_token(code: &str, at: usize) -> bool {
    code[..at]
        .chars()
        .next_back()
        .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
}

/// The forbidden modules that `source` names in code: as a path segment
/// (`exec::`, `crate::exec`) or inside a `crate::{...}` group.
fn violations(source: &str, forbidden: &[&str]) -> Vec<String> {
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    for &module in forbidden {
        let segment = format!("{module}::");
        let path = format!("crate::{module}");
        let named = code
            .match_indices(&segment)
            .chain(code.match_indices(&path))
            .any(|(at, _)| starts_token(&code, at));
        let grouped = code.match_indices("crate::{").any(|(at, _)| {
            let group = &code[at..];
            let group = &group[..group.find('}').unwrap_or(group.len())];
            group
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|word| word == module)
        });
        if named || grouped {
            found.push(module.to_string());
        }
    }
    found
}

#[test]
fn modules_name_only_the_modules_below_them() {
    let mut failures = Vec::new();
    for (module, forbidden) in RULES {
        for file in sources(module) {
            let text = std::fs::read_to_string(&file).unwrap();
            for bad in violations(&text, forbidden) {
                let root = Path::new(env!("CARGO_MANIFEST_DIR"));
                let file = file.strip_prefix(root).unwrap_or(&file);
                failures.push(format!("{} names crate::{bad}", file.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "layering broken:\n{}",
        failures.join("\n")
    );
}

#[test]
fn the_check_sees_every_form_of_naming_a_module() {
    let forbidden = &["exec", "sched"];
    assert_eq!(violations("use crate::exec::Symbols;", forbidden), ["exec"]);
    assert_eq!(
        violations("let w = crate::exec::TASK_WINDOW;", forbidden),
        ["exec"]
    );
    assert_eq!(
        violations("use crate::{abi,\n sched};", forbidden),
        ["sched"]
    );
    assert_eq!(
        violations("use super::super::sched::X;", forbidden),
        ["sched"]
    );
    assert!(violations("/// See [`crate::exec::run`].\nuse crate::abi;", forbidden).is_empty());
    assert!(violations("let my_exec::x = 1; use crate::abi::program;", forbidden).is_empty());
}
